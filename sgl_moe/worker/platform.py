"""The platform the worker runs on: SGLang's CPU engine when no CUDA device is usable (``sgl_moe.cpu_compat``)."""

from __future__ import annotations

import logging

from sgl_moe.worker.argv import ArgvView
from sgl_moe.worker.preflight import LaunchError

logger = logging.getLogger("sgl_moe.launch_server")

CPU_DEFAULT_MAX_TOTAL_TOKENS = 131072
"""KV pool cap on CPU, so several workers fit in a small machine's memory."""
CPU_DEFAULT_MEM_FRACTION = 0.5
"""On CPU SGLang requires the RAM still free after loading the weights to exceed (1 - fraction) x the RAM free
before; other workers loading at the same moment count against it. 0.05 made the third of three workers
started together fail ("Loaded weights leave no GPU memory for the KV cache"); the KV pool itself stays
capped by ``--max-total-tokens``."""


def apply_platform(argv: ArgvView):
    """Probe CUDA / sgl_kernel, make the CPU compatibility layer effective if needed; returns (plan, argv)."""
    from sgl_moe import cpu_compat

    plan = cpu_compat.probe()
    if plan.cpu_engine:
        # What the CPU engine requires (from the plan): refuse a conflicting choice, else add it.
        for dest, value in plan.required_server_args.items():
            flag = "--" + dest.replace("_", "-")
            if value is True:
                if not argv.has(flag):
                    argv = argv.plus(flag)
                continue
            given = argv.value(flag)
            if given is None:
                argv = argv.plus(flag, str(value))
            elif given != str(value):
                raise LaunchError(f"{flag} {given} was requested but no CUDA device is usable on this machine; "
                                  f"the CPU engine needs {flag} {value}")
        # Defaults the user may override.
        if not argv.has("--dtype"):
            # SGLang maps a float32 checkpoint to float16 under "auto"; on a CPU float32 is both the
            # fast and the exact choice.
            argv = argv.plus("--dtype", "float32")
        if not argv.has("--max-total-tokens"):
            argv = argv.plus("--max-total-tokens", str(CPU_DEFAULT_MAX_TOTAL_TOKENS))
        if not argv.has("--mem-fraction-static"):
            argv = argv.plus("--mem-fraction-static", str(CPU_DEFAULT_MEM_FRACTION))
        if not argv.has("--sleep-on-idle"):
            # An idle scheduler otherwise polls at full speed: ~75% of a core each, which starves the
            # other workers and the router on a small CPU machine.
            argv = argv.plus("--sleep-on-idle")
    plan.apply()
    logger.info("platform: %s", plan.reason)
    return plan, argv
