"""``python -m sgl_moe.streaming.selfcheck``: every streaming mode against resident weights, on this machine.

Runs the MoE stack on N local ranks (gloo on CPU; NCCL with ``--device cuda``, one GPU per rank), two
forwards per mode (the second uses slots refilled cyclically during the first), and compares each output
with the fully resident forward of the same rank: exact equality is expected, since the same kernels see
the same bytes in the same order.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from sgl_moe.streaming.config import MODES, StreamConfig
from sgl_moe.streaming.moe_stack import MoEStack, MoEStackConfig
from sgl_moe.streaming.ranks import run_ranks
from sgl_moe.streaming.streamer import WeightStreamer


def check_rank(rank: int, world: int, modes: list[str], window: int, first_resident: bool, device: str,
               layers: int = 5) -> dict:
    """On one rank: for each mode, whether both forwards equal the resident one, loads, device expert bytes."""
    dev = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device("cpu")
    model = MoEStack(MoEStackConfig.tiny(layers=layers), dev, seed=3)  # same weights on every rank (seeded)
    x = model.inputs(2, 12, seed=rank + 7)  # each rank its own batch (data-parallel attention)
    ref_streamer = WeightStreamer(model.store(), StreamConfig(mode="off"), dev)
    ref = model.forward(x, ref_streamer)
    ref_streamer.close()
    out = {}
    for mode in modes:
        s = WeightStreamer(model.store(), StreamConfig(mode=mode, window=window, first_layer_resident=first_resident),
                           dev)
        first = model.forward(x, s)
        second = model.forward(x, s)
        out[mode] = {"first_equal": bool(torch.equal(first, ref)), "second_equal": bool(torch.equal(second, ref)),
                     "loads": s.stats.loads, "restarts": s.stats.restarts,
                     "device_expert_bytes": s.device_expert_bytes(), "layer_bytes": model.store().layer_bytes}
        s.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.streaming.selfcheck", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--modes", default="host,on_demand,gather,hybrid")
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}; choose from {MODES}")
    if args.device == "cuda" and torch.cuda.device_count() < args.ranks:
        p.error(f"--device cuda needs {args.ranks} GPUs, found {torch.cuda.device_count()}")
    results = run_ranks(check_rank, args.ranks, modes, args.window, True, args.device,
                        backend="nccl" if args.device == "cuda" else "gloo")
    ok = all(r["first_equal"] and r["second_equal"] for res in results for r in res.values())
    print(json.dumps({"ok": ok, "ranks": results}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
