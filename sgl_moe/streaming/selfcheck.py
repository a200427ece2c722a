"""``python -m sgl_moe.streaming.selfcheck``: every streaming mode against resident weights, on this machine.

Runs the MoE stack on N local ranks (gloo on CPU; NCCL with ``--device cuda``, one GPU per rank), two
forwards per mode (the second uses slots refilled cyclically during the first), and compares each output
with the fully resident forward of the same rank: exact equality is expected, since the same kernels see
the same bytes in the same order. The default modes fit the rank count: on one GPU (one rank) host and
on_demand; gather and hybrid need 2+ ranks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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


GATHER_MODES = ("gather", "hybrid")
"""Modes that assemble a layer from peer ranks' shards: they need 2 or more ranks."""


def default_modes(ranks: int) -> list[str]:
    """Every streaming mode that works with ``ranks`` ranks."""
    return ["host", "on_demand"] + (list(GATHER_MODES) if ranks >= 2 else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.streaming.selfcheck", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, help="local ranks (default: 2 on a CPU; with --device cuda the GPUs "
                   "present, at most 2)")
    p.add_argument("--modes", help="comma-separated (default: every mode the rank count allows: host,on_demand, "
                   "and gather,hybrid with 2+ ranks)")
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and gpus == 0:
        p.error("--device cuda: no CUDA device is available")
    ranks = args.ranks if args.ranks is not None else (min(2, gpus) if args.device == "cuda" else 2)
    if ranks < 1:
        p.error(f"--ranks must be at least 1, got {ranks}")
    if args.device == "cuda" and gpus < ranks:
        p.error(f"--device cuda --ranks {ranks} needs {ranks} GPUs (one per rank), found {gpus}")
    note = None
    if args.modes is None:
        modes = default_modes(ranks)
        if ranks < 2:
            note = (f"modes {', '.join(GATHER_MODES)} assemble layers from peer ranks' shards and need 2+ ranks; "
                    f"not checked with {ranks} rank" + (f" ({gpus} GPU)" if args.device == "cuda" else ""))
            print(f"selfcheck: {note}", file=sys.stderr)
    else:
        modes = [m for m in args.modes.split(",") if m]
        bad = [m for m in modes if m not in MODES]
        if bad or not modes:
            p.error(f"unknown mode(s) {bad}; choose from {MODES}")
        need = [m for m in modes if m in GATHER_MODES]
        if need and ranks < 2:
            p.error(f"mode(s) {', '.join(need)}: assemble layers from peer ranks' shards and need --ranks 2 or more "
                    f"(one GPU per rank with --device cuda); with {ranks} rank use --modes host,on_demand")
    if args.window < 1:
        p.error("--window must be at least 1")
    results = run_ranks(check_rank, ranks, modes, args.window, True, args.device,
                        backend="nccl" if args.device == "cuda" else "gloo")
    ok = all(r["first_equal"] and r["second_equal"] for res in results for r in res.values())
    result = {"ok": ok, "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "world": ranks, "modes": modes, "note": note, "ranks": results}
    text = json.dumps(result, indent=1)
    if args.json:  # the JSON goes to the file; stdout gets a table
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
        print(table(result))
    else:
        print(text)
    return 0 if ok else 1


def table(result: dict) -> str:
    lines = [f"streaming selfcheck on {result['device']} (torch {result['torch']}), {result['world']} rank(s): "
             f"{'ok' if result['ok'] else 'FAILED'}" + (f"; {result['note']}" if result["note"] else ""), "",
             "| rank | mode | first forward = resident | second forward = resident | loads | device expert MB |",
             "|---|---|---|---|---|---|"]
    for rank, res in enumerate(result["ranks"]):
        for mode, r in res.items():
            lines.append(f"| {rank} | {mode} | {r['first_equal']} | {r['second_equal']} | {r['loads']} | "
                         f"{r['device_expert_bytes'] / 1e6:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
