"""``python -m sgl_moe.streaming.bench``: prefill throughput with experts resident, streamed, or loaded on demand.

Torch only (runs where SGLang is not installed). A stack of MoE layers shaped like Qwen3-30B-A3B (hidden 2048,
128 experts of width 768, top-8, GQA attention 32/4 heads; random bf16 weights) runs prefill batches of 4k to
128k tokens (sequences of 4,096 tokens) four ways:
- ``resident``: every layer's experts on the GPU (the reference);
- ``streamed``: experts in pinned host memory, a window of 2 layer slots refilled on a copy stream while the
  current layer computes (the AsyncEP host mode, first layer streamed too: expert memory = window x layer);
- ``on_demand``: the same pinned store, each layer copied when it is reached, the compute waiting for it;
- ``on_demand_pageable``: the same from ordinary (pageable) host memory, as a naive offload does.
Each forward is timed with CUDA events (median of ``--reps`` after ``--warmup``); MFU against ``--peak-tflops``.
The streamed / resident ratio is compared with T* from ``physics.md`` and with T* from this run's own
measurements (one layer's copy time over one token-layer's compute time). ``--tiny`` runs the same on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from sgl_moe.streaming.config import StreamConfig
from sgl_moe.streaming.expert_store import ExpertStore
from sgl_moe.streaming.moe_stack import MoEStack, MoEStackConfig
from sgl_moe.streaming.streamer import WeightStreamer

WAYS = {
    "resident": (StreamConfig(mode="off"), True),
    "streamed": (StreamConfig(mode="host", window=2, first_layer_resident=False), True),
    "on_demand": (StreamConfig(mode="on_demand"), True),
    "on_demand_pageable": (StreamConfig(mode="on_demand"), False),
}
PHYSICS_T_STAR = {"pcie_whole_layer": 150_000, "pcie_counting_attention": 100_000}
"""physics.md: T* = (E/k)·F_eff/B for host streaming of a whole layer over PCIe (F_eff = 50% of peak)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_forward(model: MoEStack, x: torch.Tensor, streamer: WeightStreamer, warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        model.forward(x, streamer)
    _sync(model.device)
    times = []
    for _ in range(reps):
        if model.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model.forward(x, streamer)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            model.forward(x, streamer)
            times.append(time.perf_counter() - t0)
    return times


def _copy_time(store: ExpertStore, device: torch.device, reps: int = 5) -> float:
    """Seconds to copy one layer's experts from the pinned store to the device (median after one warm-up),
    alone: CUDA events around the copies on a GPU, perf_counter on a CPU."""
    dst = [torch.empty_like(store[0].w13, device=device), torch.empty_like(store[0].w2, device=device)]
    times = []
    for i in range(reps + 1):
        _sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        dst[0].copy_(store[i % len(store)].w13, non_blocking=True)
        dst[1].copy_(store[i % len(store)].w2, non_blocking=True)
        if device.type == "cuda":
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            seconds = time.perf_counter() - t0
        if i:
            times.append(seconds)
    return statistics.median(times)


def _measure(model: MoEStack, stores: dict, x: torch.Tensor, way: str, ref_out: torch.Tensor | None, flops: float,
             warmup: int, reps: int, peak_flops: float) -> tuple[dict, torch.Tensor]:
    device = model.device
    scfg, pinned = WAYS[way]
    _sync(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    streamer = WeightStreamer(stores[pinned], scfg, device)
    try:
        _sync(device)
        measured_mem = (torch.cuda.memory_allocated(device) - before) if device.type == "cuda" else None
        out = model.forward(x, streamer)
        max_diff = 0.0 if ref_out is None else float((out.float() - ref_out.float()).abs().max())
        times = _time_forward(model, x, streamer, warmup, reps)
    finally:
        streamer.close()
    t = statistics.median(times)
    tokens = x.shape[0] * x.shape[1]
    return {"tokens": tokens, "batch": x.shape[0], "seq": x.shape[1], "way": way, "median_s": t,
            "spread_s": max(times) - min(times), "tokens_per_s": tokens / t, "mfu": flops / t / peak_flops,
            "expert_bytes_on_device": streamer.device_expert_bytes(), "measured_allocated_bytes": measured_mem,
            "max_abs_diff_vs_first_way": max_diff, "loads": streamer.stats.loads}, out


def run(cfg: MoEStackConfig, device: torch.device, sizes: list[int], seq: int, ways: list[str], warmup: int,
        reps: int, peak_flops: float, progress=print) -> dict:
    model = MoEStack(cfg, device)
    stores = {True: model.store(pin=True), False: model.store(pin=False)}
    layer_bytes = stores[True].layer_bytes
    copy_s = _copy_time(stores[True], device)
    rows = []
    for tokens in sizes:
        s = min(seq, tokens)
        batch = max(1, tokens // s)
        x = model.inputs(batch, s)
        flops = cfg.flops(batch, s)
        ref_out = None
        for way in ways:
            try:
                row, out = _measure(model, stores, x, way, ref_out, flops, warmup, reps, peak_flops)
            except torch.cuda.OutOfMemoryError:
                # A smaller GPU may not fit the largest batches: say so and go on with the other sizes.
                row, out = {"tokens": batch * s, "way": way, "error": "out of memory"}, None
                progress(f"{batch * s:>7} tokens  {way:<19} out of memory")
            else:
                progress(f"{row['tokens']:>7} tokens  {way:<19} {row['median_s'] * 1e3:9.2f} ms  "
                         f"{row['tokens_per_s']:>12,.0f} tok/s  MFU {row['mfu']:.3f}  "
                         f"experts on device {row['expert_bytes_on_device'] / 1e9:.2f} GB")
            if ref_out is None and out is not None:
                ref_out = out
            del out
            rows.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return summarize(cfg, rows, layer_bytes, copy_s, peak_flops, device)


def summarize(cfg: MoEStackConfig, rows: list[dict], layer_bytes: int, copy_s: float, peak_flops: float,
              device: torch.device) -> dict:
    by = {(r["tokens"], r["way"]): r for r in rows if "error" not in r}
    sizes = sorted({r["tokens"] for r in rows})
    ratios = []
    for n in sizes:
        res, st, od = by.get((n, "resident")), by.get((n, "streamed")), by.get((n, "on_demand"))
        odp = by.get((n, "on_demand_pageable"))
        ratios.append({
            "tokens": n,
            "streamed_over_resident": res["median_s"] / st["median_s"] if res and st else None,
            "streamed_over_on_demand": od["median_s"] / st["median_s"] if od and st else None,
            "streamed_over_on_demand_pageable": odp["median_s"] / st["median_s"] if odp and st else None,
        })
    crossing = None
    for i, r in enumerate(ratios):
        if r["streamed_over_resident"] is not None and all(
                (x["streamed_over_resident"] or 0) >= 0.95 for x in ratios[i:]):
            crossing = r["tokens"]
            break
    # This run's own T*: tokens at which one layer's compute (resident, per token) equals one layer's copy.
    measured = [n for n in sizes if (n, "resident") in by]
    largest = max(measured) if measured else None
    res = by[(largest, "resident")] if largest else None
    per_token_layer_s = res["median_s"] / largest / cfg.layers if res else None
    t_star_measured = copy_s / per_token_layer_s if per_token_layer_s else None
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "config": asdict(cfg), "peak_flops": peak_flops,
        "layer_bytes": layer_bytes, "copy_one_layer_s": copy_s, "h2d_gb_per_s": layer_bytes / copy_s / 1e9,
        "rows": rows, "ratios": ratios, "crossing_0_95_tokens": crossing,
        "t_star_measured_tokens": t_star_measured, "t_star_physics_tokens": PHYSICS_T_STAR,
        "streamed_expert_bytes_equal_window_x_layer": all(
            r["expert_bytes_on_device"] == 2 * layer_bytes for r in by.values() if r["way"] == "streamed"),
    }


def table(result: dict) -> str:
    lines = [f"device {result['device']}, torch {result['torch']}; "
             f"one expert layer {result['layer_bytes'] / 1e9:.3f} GB, "
             f"H2D copy {result['copy_one_layer_s'] * 1e3:.2f} ms ({result['h2d_gb_per_s']:.1f} GB/s)",
             "| tokens | resident tok/s | streamed tok/s | on-demand tok/s | pageable on-demand tok/s | MFU resident | "
             "MFU streamed | streamed/resident | streamed/on-demand | streamed/pageable |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["tokens"], r["way"]): r for r in result["rows"]}

    def f(n, way, key, fmt):
        r = by.get((n, way))
        if r and "error" in r:
            return "OOM"
        return format(r[key], fmt) if r else "-"

    for ratio in result["ratios"]:
        n = ratio["tokens"]

        def g(key, ratio=ratio):
            return f"{ratio[key]:.3f}" if ratio[key] is not None else "-"

        lines.append(f"| {n:,} | {f(n, 'resident', 'tokens_per_s', ',.0f')} | "
                     f"{f(n, 'streamed', 'tokens_per_s', ',.0f')} | "
                     f"{f(n, 'on_demand', 'tokens_per_s', ',.0f')} | "
                     f"{f(n, 'on_demand_pageable', 'tokens_per_s', ',.0f')} | "
                     f"{f(n, 'resident', 'mfu', '.3f')} | {f(n, 'streamed', 'mfu', '.3f')} | "
                     f"{g('streamed_over_resident')} | "
                     f"{g('streamed_over_on_demand')} | {g('streamed_over_on_demand_pageable')} |")
    t_meas = result["t_star_measured_tokens"]
    lines.append(f"streamed >= 0.95 x resident from {result['crossing_0_95_tokens'] or 'no measured size'} tokens; "
                 f"T* measured here {t_meas:,.0f} tokens" if t_meas else "")
    lines.append(f"T* from physics.md: ~{PHYSICS_T_STAR['pcie_whole_layer']:,} tokens (~"
                 f"{PHYSICS_T_STAR['pcie_counting_attention']:,} counting attention); streamed expert memory = "
                 f"window x layer: {result['streamed_expert_bytes_equal_window_x_layer']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.streaming.bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny float32 layers (CPU smoke test, CI)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--sizes", default="4096,8192,16384,32768,65536,131072", help="prefill batch sizes in tokens")
    p.add_argument("--seq", type=int, default=4096, help="tokens per sequence (a batch is tokens / seq sequences)")
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100/H200 SXM: 989)")
    p.add_argument("--json", type=Path, help="write the full result here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available (use --device cpu --tiny for the smoke test)")
    ways = [w for w in args.ways.split(",") if w]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        p.error(f"unknown way(s) {unknown}; choose from {list(WAYS)}")
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        p.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 1 or args.layers < 2:
        p.error("need at least one positive size and at least 2 layers")
    cfg = MoEStackConfig.tiny(layers=args.layers) if args.tiny else MoEStackConfig.qwen3_30b_a3b(layers=args.layers)
    if device.type == "cpu" and not args.tiny:
        print("warning: full-size layers on a CPU take very long; --tiny is the CPU smoke test", file=sys.stderr)
    result = run(cfg, device, sizes, args.seq, ways, args.warmup, args.reps, args.peak_tflops * 1e12,
                 progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
