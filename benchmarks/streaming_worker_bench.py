"""Host weight streaming inside SGLang against unpatched SGLang, side by side on one machine.

    .venv/bin/python benchmarks/streaming_worker_bench.py --plain URL --streaming URL [--sizes 512,2048,4000]

Both workers serve the same model (start one with ``--moe-weight-streaming host``). Each round sends the same
fresh random prompt (no prefix reuse) to both, alternating which goes first, one request at a time, with
``max_new_tokens`` 1; reports median latency per size, the ratio streaming / plain, and whether the first
output token agreed. On a CPU the "device" slots and the host store are both RAM, so this measures the
engine's overhead (copy thread, fences, slot swaps), not PCIe.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import httpx


def _one(client: httpx.Client, url: str, ids: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = client.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1,
                                                                                   "temperature": 0}})
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["output_ids"][0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plain", required=True)
    p.add_argument("--streaming", required=True)
    p.add_argument("--sizes", default="512,2048,4000")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    args = p.parse_args(argv)
    rng = random.Random(0)
    print("| prompt tokens | plain median s | streaming median s | streaming / plain | same first token |")
    print("|---|---|---|---|---|")
    with httpx.Client(timeout=600) as client:
        for size in (int(s) for s in args.sizes.split(",")):
            times = {"plain": [], "streaming": []}
            agree = 0
            for r in range(args.rounds + 1):
                ids = [rng.randrange(16, args.vocab) for _ in range(size)]
                order = ["plain", "streaming"] if r % 2 else ["streaming", "plain"]
                out = {}
                for name in order:
                    t, tok = _one(client, getattr(args, name), ids)
                    out[name] = tok
                    if r:  # round 0 warms up
                        times[name].append(t)
                agree += out["plain"] == out["streaming"]
            mp, ms = statistics.median(times["plain"]), statistics.median(times["streaming"])
            print(f"| {size} | {mp:.3f} | {ms:.3f} | {ms / mp:.3f} | {agree}/{args.rounds + 1} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
