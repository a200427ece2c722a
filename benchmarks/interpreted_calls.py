"""Interpreted calls per request of a live router: what still runs as Python bytecode on the request path.

    PYTHONPATH=benchmarks/interpreted_calls INTERPRETED_CALLS_OUT=/tmp/calls \\
        .venv/bin/python benchmarks/router_capacity.py --routers sgl_moe --prompt-tokens 2000 --shapes shared \\
        --requests 30000 --warmup 500 --repeats 1 --no-warm-up-run &
    .venv/bin/python benchmarks/interpreted_calls.py --out-dir /tmp/calls

The first command's router (only it: ``benchmarks/interpreted_calls/sitecustomize.py`` acts in a process running
``sgl_moe.router``) counts every call into bytecode with ``sys.setprofile``; compiled functions and C make none.
This script finds that router (the process ``python -m sgl_moe.router --host ...``, its ``--port``), asks it for its
counts twice (``SIGUSR1``), ``--window`` seconds apart, reads its ``requests_total`` from ``/metrics`` at each, and
prints the calls made in between per request answered. The profile hook slows the router: the figures are counts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path


def find_router() -> tuple[int, int] | None:
    """(pid, port) of a running ``python -m sgl_moe.router --host ... --port N``, if one runs."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if "sgl_moe.router" in args and "--host" in args and "--port" in args:
            return int(entry.name), int(args[args.index("--port") + 1])
    return None


def requests_total(port: int) -> float:
    """The router's answered requests so far (``sgl_moe_router_requests_total``, every endpoint and status)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^sgl_moe_router_requests_total\{[^}]*\} (\S+)$", text, re.M))


def snapshot(pid: int, out_dir: Path, timeout_s: float = 10.0) -> dict[str, int]:
    """The router's counts now: a ``SIGUSR1``, then the file its hook writes."""
    before = set(out_dir.glob(f"calls-{pid}-*.json"))
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = set(out_dir.glob(f"calls-{pid}-*.json")) - before
        if new:
            return json.loads(max(new, key=lambda p: int(p.stem.rsplit("-", 1)[1])).read_text())["counts"]
        time.sleep(0.05)
    raise TimeoutError(f"router {pid} wrote no counts to {out_dir} (started with the hook on PYTHONPATH?)")


def per_request(first: dict[str, int], second: dict[str, int], requests: float) -> list[tuple[str, float]]:
    """Calls made between two snapshots, per request, most first."""
    if requests <= 0:
        raise ValueError("no request was answered between the two snapshots")
    made = {k: n - first.get(k, 0) for k, n in second.items()}
    return sorted(((k, n / requests) for k, n in made.items() if n > 0), key=lambda kv: -kv[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, required=True, help="the router's INTERPRETED_CALLS_OUT")
    parser.add_argument("--window", type=float, default=5.0, help="seconds between the two snapshots")
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the router to start")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.wait
    found = find_router()
    while found is None and time.monotonic() < deadline:
        time.sleep(1)
        found = find_router()
    if found is None:
        print("error: no `python -m sgl_moe.router --host ... --port ...` is running", file=sys.stderr)
        return 1
    pid, port = found
    time.sleep(min(10.0, args.window))  # past its start-up
    n0, first = requests_total(port), snapshot(pid, args.out_dir)
    time.sleep(args.window)
    n1, second = requests_total(port), snapshot(pid, args.out_dir)
    rows = per_request(first, second, n1 - n0)
    total = sum(v for _, v in rows)
    print(f"router {pid}: {n1 - n0:.0f} requests in {args.window:.0f} s; {total:.2f} interpreted calls per request")
    for name, v in rows[:args.top]:
        print(f"  {v:7.2f}  {name}")
    if args.out:
        args.out.write_text(json.dumps({"requests": n1 - n0, "calls_per_request": total, "calls": dict(rows)},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
