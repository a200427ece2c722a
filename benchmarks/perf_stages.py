"""Where a live router's CPU goes, stage by stage, from ``perf``'s call stacks.

    perf record -F 1500 --call-graph dwarf,16384 -o router.data -p <router pid> -- sleep 7
    perf script -i router.data -F ip,sym,dso > router.stacks
    .venv/bin/python benchmarks/perf_stages.py router.stacks [--stage parse] [--out FILE.json]

Record while ``router_capacity.py`` drives the router (a long single-router run, e.g. ``--routers sgl_moe
--requests 12000``; the router is the process ``python -m sgl_moe.router --host ...``). Each sample is charged to
the innermost stage on its stack (``STAGES``: the first frame, leaf first, whose function or file names one), so a
stage's share holds the interpreter, libc and kernel work done on its behalf (a socket write's kernel time is the
stage that wrote). Samples with no stage on their stack are listed by the file their leaf ran in.

``--stage NAME`` also prints, for that stage's samples, the innermost router function (own time, the runtime below
it included) and each router function's inclusive share.

Compiled modules (Cython) and the C extensions keep their symbols, so the stacks name the router's functions; a
router whose modules run from source shows only the interpreter's frames (build it first: ``tools/bootstrap.sh``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("events", ("/router/membership/event_", "/router/membership/kv_events", "native_kv_payload", "zmq")),
    ("release", ("Scheduler_8release", "Router_52_release", "Router_49_release")),
    ("note_cached", ("note_cached",)),
    ("job_and_hashes", ("_job_of", "Router_59_job", "Router_56_job", "prompt_keys", "page_hashes", "chain_over_bytes",
                        "block_hash_chain")),
    ("attempt", ("attempt_7Attempt", "ids_json", "json_text")),
    ("parse", ("/router/request/", "/router/front/intake")),
    ("place", ("/router/placement/",)),
    ("worker_recv", ("_Connection_5data_received", "_Connection_9_read_fast", "_Connection_7_read_fast")),
    ("worker_send", ("/router/front/worker_client",)),
    ("forwarder", ("/router/front/forwarding",)),
    ("client_recv", ("BareConnection_9data_received", "BareConnection_11_read_fast", "BareConnection_10_read_fast",
                     "_dispatch")),
    ("client_answer", ("/router/front/http_server", "/router/front/answer", "/router/front/deadline")),
    ("handler", ("/router/",)),
]
"""Stage name, then substrings of a frame's function or file name that put a sample in it (first match wins). Only
frames in the router's own files (and ZMQ's, for events) are looked at: the kernel's and the interpreter's names say
nothing about the stage."""

_FRAME = re.compile(r"(\S+)\s+(.*)\s+\((.*)\)$")
_PYX = re.compile(r"__pyx_(pw|pf|gb|f)_7sgl_moe_6router_")


def read_stacks(path: Path) -> list[list[tuple[str, str]]]:
    """``perf script -F ip,sym,dso`` output: one list of (function, file) per sample, leaf first."""
    samples: list[list[tuple[str, str]]] = []
    frames: list[tuple[str, str]] = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                if frames:
                    samples.append(frames)
                    frames = []
                continue
            m = _FRAME.match(line)
            if m:
                frames.append((m.group(2), m.group(3)))
    if frames:
        samples.append(frames)
    return samples


def stage_of(stack: list[tuple[str, str]]) -> str:
    for sym, dso in stack:
        if "/router/" not in dso and "zmq" not in dso:
            continue
        for name, keys in STAGES:
            if any(k in sym or k in dso for k in keys):
                return name
    leaf = stack[0][1].rsplit("/", 1)[-1]
    return "other: " + ("kernel" if "kernel" in leaf else leaf)


def _router_function(sym: str, dso: str) -> str | None:
    if "/router/" not in dso:
        return None
    if sym.startswith("__pyx_p") or sym.startswith("__pyx_g"):
        return _PYX.sub("", sym)
    return sym if "native_" in dso else None


def within(samples: list[list[tuple[str, str]]], stage: str) -> tuple[int, Counter, Counter]:
    """(samples in ``stage``, innermost router function's count, each router function's inclusive count)."""
    own: Counter = Counter()
    inclusive: Counter = Counter()
    n = 0
    for stack in samples:
        if stage_of(stack) != stage:
            continue
        n += 1
        names = [f for f in (_router_function(s, d) for s, d in stack) if f]
        if names:
            own[names[0]] += 1
        inclusive.update(dict.fromkeys(names, 1))
    return n, own, inclusive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stacks", type=Path, help="perf script -F ip,sym,dso output")
    parser.add_argument("--stage", help="also break this stage down by router function")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    samples = read_stacks(args.stacks)
    if not samples:
        print(f"error: no samples in {args.stacks} (perf script -F ip,sym,dso output?)", file=sys.stderr)
        return 1
    shares = Counter(stage_of(s) for s in samples)
    total = len(samples)
    print(f"{total} samples\n\n| stage | share |\n|---|---:|")
    for name, count in shares.most_common():
        print(f"| {name} | {100 * count / total:.1f}% |")
    out = {"samples": total, "stages": {k: v / total for k, v in shares.most_common()}}
    if args.stage:
        n, own, inclusive = within(samples, args.stage)
        print(f"\n{args.stage}: {n} samples; innermost router function (share of all samples):")
        for name, count in own.most_common(25):
            print(f"  {100 * count / total:5.1f}%  {name}")
        print(f"\n{args.stage}: router functions, inclusive:")
        for name, count in inclusive.most_common(25):
            print(f"  {100 * count / total:5.1f}%  {name}")
        out["stage"] = {"name": args.stage, "samples": n, "own": dict(own.most_common(25)),
                        "inclusive": dict(inclusive.most_common(25))}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
