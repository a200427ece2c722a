"""Counts the calls a live router makes into Python bytecode (``benchmarks/interpreted_calls.py`` reads them).

Loaded by Python at start where this folder is on ``PYTHONPATH``; acts only in a process whose command line runs
``sgl_moe.router`` and only when ``INTERPRETED_CALLS_OUT`` names a folder. ``sys.setprofile`` sees every call that runs
bytecode (compiled functions and C run without one); each is counted by its code's file, first line and qualified name
(a ``dataclass``-written ``__init__`` by its class). On ``SIGUSR1`` the counts so far go to
``$INTERPRETED_CALLS_OUT/calls-<pid>-<n>.json``. Slows the router: a count, not a timing.
"""

import os
import sys

_OUT = os.environ.get("INTERPRETED_CALLS_OUT")
if _OUT and "sgl_moe.router" in " ".join(getattr(sys, "orig_argv", sys.argv)):
    import collections
    import json
    import signal
    import time

    _counts: collections.Counter = collections.Counter()
    _dumps = [0]

    def _count(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename == "<string>":  # written by dataclasses (or another exec): name it by its object's class
            owner = frame.f_locals.get("self")
            _counts[f"<string>:{type(owner).__name__}.{code.co_name}"] += 1
        else:
            _counts[f"{code.co_filename}:{code.co_firstlineno}:{code.co_qualname}"] += 1

    def _dump(signum, frame):
        sys.setprofile(None)  # the dump's own calls are not the router's
        try:
            _dumps[0] += 1
            path = os.path.join(_OUT, f"calls-{os.getpid()}-{_dumps[0]}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"t": time.monotonic(), "counts": dict(_counts)}, f)
            os.replace(path + ".tmp", path)
        finally:
            sys.setprofile(_count)

    os.makedirs(_OUT, exist_ok=True)
    signal.signal(signal.SIGUSR1, _dump)
    sys.setprofile(_count)
