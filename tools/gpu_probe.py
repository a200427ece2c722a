"""GPU probe: what the machine is and the ceilings the benchmarks are read against. Torch + stdlib only.

    python tools/gpu_probe.py --json probe.json --md probe.md            # on the GPU machine
    python tools/gpu_probe.py --device cpu --smoke --json ... --md ...   # CPU smoke (tiny sizes)

Reports: device and software; usable cores (affinity mask, cgroup quota; sgl_moe.streaming.host_cpus);
host<->device copy bandwidth from pinned and pageable memory and device-to-device (bytes read + written);
one Qwen3-30B-A3B expert batch copied row by row (what the offload engine's batched copy does) against the
same bytes in one copy; a dense bf16 matrix product's rate (the MFU denominator seen on this card); the
grouped GEMM (torch._grouped_mm) against the per-expert loop at the real layer shape (error, time) and the
synchronizing calls of experts_forward; a pinned copy on a side stream during compute (inside the compute
window or not), and the same from pageable memory. CUDA events, warm-ups, medians; random data, never zeros.
Exit 1 when a check fails (grouped GEMM error, a sync in experts_forward).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sgl_moe.offload.engine import gather_rows  # noqa: E402
from sgl_moe.streaming.expert_store import LayerWeights  # noqa: E402
from sgl_moe.streaming.host_cpus import host_cpus  # noqa: E402
from sgl_moe.streaming.moe_math import _use_grouped, experts_forward, route  # noqa: E402
from sgl_moe.streaming.moe_stack import MoEStackConfig  # noqa: E402


def _timer(device: torch.device):
    """time(fn, reps, warmup) -> median seconds: CUDA events on the current stream, perf_counter on a CPU."""
    def run(fn, reps: int = 10, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            if device.type == "cuda":
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    return run


def environment(device: torch.device) -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "platform": platform.platform(), "device": "cpu"}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out.update(device=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                   memory_gib=round(p.total_memory / 2**30, 1), l2_mb=round(getattr(p, "L2_cache_size", 0) / 1e6, 1),
                   gpus=torch.cuda.device_count())
    return out


def cores() -> dict:
    return {**host_cpus().as_dict(), "torch_threads": torch.get_num_threads()}


def transfers(device: torch.device, nbytes: int, time_fn) -> dict:
    """GB/s of one copy of ``nbytes`` (D2D counts bytes read plus written)."""
    n = nbytes // 2
    src_host = torch.randn(n).to(torch.bfloat16)
    pinned = src_host.pin_memory() if device.type == "cuda" else src_host
    out: dict = {"bytes": n * 2}
    if device.type != "cuda":
        dst = torch.empty_like(src_host)
        out["host_memcpy_gb_s"] = n * 2 / time_fn(lambda: dst.copy_(src_host)) / 1e9
        return out
    dev = torch.empty(n, dtype=torch.bfloat16, device=device)
    dev2 = torch.empty_like(dev)
    out["h2d_pinned_gb_s"] = n * 2 / time_fn(lambda: dev.copy_(pinned, non_blocking=True)) / 1e9
    out["h2d_pageable_gb_s"] = n * 2 / time_fn(lambda: dev.copy_(src_host)) / 1e9
    back = torch.empty_like(pinned)
    out["d2h_pinned_gb_s"] = n * 2 / time_fn(lambda: back.copy_(dev, non_blocking=True)) / 1e9
    dev.normal_()
    out["d2d_gb_s_read_plus_write"] = 2 * n * 2 / time_fn(lambda: dev2.copy_(dev)) / 1e9
    return out


def expert_rows(device: torch.device, cfg: MoEStackConfig, experts: int, time_fn) -> dict:
    """``experts`` experts of one layer (w13 and w2 rows) from the pinned store: row by row through the offload
    engine's gather_rows (torch._foreach_copy_, per-row DMAs) against one copy of the same bytes."""
    dt = cfg.torch_dtype
    stored = min(cfg.experts, 2 * experts)  # a store of 2x the experts copied: every other row, scattered
    w13 = torch.randn(stored, 2 * cfg.expert_width, cfg.hidden).to(dt)
    w2 = torch.randn(stored, cfg.hidden, cfg.expert_width).to(dt)
    if device.type == "cuda":
        w13, w2 = w13.pin_memory(), w2.pin_memory()
    ids = list(range(0, stored, max(1, stored // experts)))[:experts]
    d13 = torch.empty((experts, *w13.shape[1:]), dtype=dt, device=device)
    d2 = torch.empty((experts, *w2.shape[1:]), dtype=dt, device=device)
    dst = list(d13.unbind(0)) + list(d2.unbind(0))
    src = [w13[e] for e in ids] + [w2[e] for e in ids]
    nbytes = sum(t.numel() * t.element_size() for t in src)
    rows_s = time_fn(lambda: gather_rows(dst, src))
    whole13, whole2 = w13[:experts], w2[:experts]  # contiguous: the same bytes in one copy per tensor

    def one() -> None:
        d13.copy_(whole13, non_blocking=True)
        d2.copy_(whole2, non_blocking=True)

    one_s = time_fn(one)
    ok = all(torch.equal(d.cpu(), s) for d, s in zip(dst, src)) if device.type == "cpu" else None
    if device.type == "cuda":
        gather_rows(dst, src)
        torch.cuda.synchronize()
        ok = all(torch.equal(d.cpu(), s) for d, s in zip(dst, src))
    return {"experts": experts, "bytes": nbytes, "expert_mb": nbytes / experts / 1e6, "rows_s": rows_s,
            "one_copy_s": one_s, "rows_gb_s": nbytes / rows_s / 1e9, "one_copy_gb_s": nbytes / one_s / 1e9,
            "rows_over_one_copy_time": rows_s / one_s, "rows_copied_right": ok}


def matmul_rate(device: torch.device, n: int, dtype: torch.dtype, time_fn) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    t = time_fn(lambda: a @ b, reps=10, warmup=3)
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "seconds": t, "tflops": 2 * n ** 3 / t / 1e12}


def grouped_gemm(device: torch.device, cfg: MoEStackConfig, tokens: int, time_fn) -> dict:
    """experts_forward at the layer shape: grouped GEMM vs the per-expert loop (same bf16 inputs)."""
    dt = cfg.torch_dtype
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(tokens, cfg.hidden, device=device, generator=gen).to(dt)
    w = LayerWeights((torch.randn(cfg.experts, 2 * cfg.expert_width, cfg.hidden, device=device, generator=gen)
                      * cfg.hidden ** -0.5).to(dt),
                     (torch.randn(cfg.experts, cfg.hidden, cfg.expert_width, device=device, generator=gen)
                      * cfg.expert_width ** -0.5).to(dt))
    gate = torch.randn(cfg.experts, cfg.hidden, device=device, generator=gen).to(dt)
    weights, ids = route(x @ gate.T, cfg.top_k)
    available = _use_grouped(x)
    out: dict = {"tokens": tokens, "dtype": cfg.dtype, "grouped_available": available,
                 "has_torch__grouped_mm": hasattr(torch, "_grouped_mm")}
    loop = experts_forward(x, weights, ids, w, grouped=False)
    out["loop_s"] = time_fn(lambda: experts_forward(x, weights, ids, w, grouped=False), reps=5)
    if available:
        grouped = experts_forward(x, weights, ids, w, grouped=True)
        out["rel_err_grouped_vs_loop"] = float((grouped.float() - loop.float()).norm() / loop.float().norm())
        out["bit_equal_grouped_vs_loop"] = bool(torch.equal(grouped, loop))
        out["grouped_s"] = time_fn(lambda: experts_forward(x, weights, ids, w, grouped=True), reps=5)
        out["speedup"] = out["loop_s"] / out["grouped_s"]
        flops = 2 * tokens * cfg.top_k * 3 * cfg.hidden * cfg.expert_width
        out["grouped_tflops"] = flops / out["grouped_s"] / 1e12
    if device.type == "cuda":
        from sgl_moe.streaming.gpu_timing import count_syncs

        out["syncs_per_call"] = count_syncs(lambda: experts_forward(x, weights, ids, w))[0]
    return out


def copy_during_compute(device: torch.device, nbytes: int) -> dict:
    """A host->device copy issued on a side stream while the current stream computes for ~4x the copy:
    did it land inside the compute window, and what did it add to the window? Pinned vs pageable."""
    from sgl_moe.streaming.gpu_timing import ComputeLoad, event, time_cuda

    n = nbytes // 2
    pinned = torch.randn(n).to(torch.bfloat16).pin_memory()
    pageable = torch.randn(n).to(torch.bfloat16)
    dst = torch.empty(n, dtype=torch.bfloat16, device=device)
    side = torch.cuda.Stream(device)
    copy_s = time_cuda(lambda: dst.copy_(pinned, non_blocking=True), reps=5)
    load = ComputeLoad(device)
    compute_s = time_cuda(lambda: load.issue(4 * copy_s), reps=3, warmup=1)
    out = {"bytes": n * 2, "copy_alone_s": copy_s, "compute_alone_s": compute_s}
    for name, src in (("pinned", pinned), ("pageable", pageable)):
        windows, inside = [], []
        for _ in range(3):
            torch.cuda.synchronize()
            start = event()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                c0 = event()
                dst.copy_(src, non_blocking=True)
                c1 = event()
            load.issue(4 * copy_s)
            end = event()
            torch.cuda.synchronize()
            windows.append(start.elapsed_time(end) / 1e3)
            inside.append(start.elapsed_time(c0) >= 0 and c1.elapsed_time(end) > 0 and
                          start.elapsed_time(c1) > 0)
        w = statistics.median(windows)
        out[name] = {"window_s": w, "added_s": w - compute_s, "hidden_fraction": max(0.0, 1 - (w - compute_s) / copy_s),
                     "copy_inside_compute_window": all(inside)}
    return out


def markdown(r: dict) -> str:
    e = r["environment"]
    lines = [f"# GPU probe: {e['device']}", "",
             f"torch {e['torch']} (CUDA {e['cuda']}), triton {e['triton']}, Python {e['python']}; "
             + (f"capability {e['capability']}, {e['sms']} SMs, {e['memory_gib']} GiB, L2 {e['l2_mb']} MB; "
                if "sms" in e else "") + f"smoke: {r['smoke']}", "",
             f"cores: usable {r['cores']['usable']} (affinity {r['cores']['affinity']}, cgroup quota "
             f"{r['cores']['quota_cpus']}, os.cpu_count {r['cores']['os_cpu_count']}), torch threads "
             f"{r['cores']['torch_threads']}", "", "| measurement | value |", "|---|---|"]
    for k, v in r["transfers"].items():
        if k != "bytes":
            lines.append(f"| {k} ({r['transfers']['bytes'] / 2**20:.0f} MiB) | {v:.1f} |")
    x = r["expert_rows"]
    lines += [f"| {x['experts']} experts ({x['expert_mb']:.2f} MB each) row by row, GB/s | {x['rows_gb_s']:.1f} |",
              f"| same bytes in one copy, GB/s | {x['one_copy_gb_s']:.1f} |",
              f"| rows / one copy (time) | {x['rows_over_one_copy_time']:.3f} |",
              f"| matmul {r['matmul']['dtype']} {r['matmul']['n']}^3, TFLOP/s | {r['matmul']['tflops']:.1f} |"]
    g = r["grouped_gemm"]
    lines.append(f"| grouped GEMM available ({g['dtype']}) | {g['grouped_available']} |")
    if g["grouped_available"]:
        lines += [f"| experts_forward {g['tokens']} tokens: grouped / loop ms | {g['grouped_s'] * 1e3:.3f} / "
                  f"{g['loop_s'] * 1e3:.3f} ({g['speedup']:.1f}x) |",
                  f"| grouped vs loop rel. error (bit equal) | {g['rel_err_grouped_vs_loop']:.2e} "
                  f"({g['bit_equal_grouped_vs_loop']}) |"]
    if "syncs_per_call" in g:
        lines.append(f"| experts_forward synchronizing calls | {g['syncs_per_call']} |")
    c = r.get("copy_during_compute")
    if c:
        for name in ("pinned", "pageable"):
            lines.append(f"| {name} H2D {c['bytes'] / 2**20:.0f} MiB during compute: inside window / hidden | "
                         f"{c[name]['copy_inside_compute_window']} / {c[name]['hidden_fraction'] * 100:.0f}% |")
    lines += ["", f"checks: {'ok' if r['ok'] else 'FAILED: ' + '; '.join(r['failures'])}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CPU smoke test)")
    p.add_argument("--json", type=Path)
    p.add_argument("--md", type=Path)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available (use --device cpu --smoke)")
    time_fn = _timer(device)
    cfg = MoEStackConfig.tiny() if args.smoke else MoEStackConfig.qwen3_30b_a3b()
    if args.smoke and device.type == "cpu":
        cfg = MoEStackConfig(hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_width=32,
                             dtype="bfloat16")
    r: dict = {"smoke": args.smoke, "environment": environment(device), "cores": cores()}
    print(f"probe: {r['environment']['device']}, usable cores {r['cores']['usable']}", file=sys.stderr, flush=True)
    r["transfers"] = transfers(device, (8 << 20) if args.smoke else (256 << 20), time_fn)
    r["expert_rows"] = expert_rows(device, cfg, 8 if cfg.experts >= 8 else cfg.experts, time_fn)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    r["matmul"] = matmul_rate(device, 256 if args.smoke else 8192, dt, time_fn)
    r["grouped_gemm"] = grouped_gemm(device, cfg, 64 if args.smoke else 4096, time_fn)
    if device.type == "cuda":
        r["copy_during_compute"] = copy_during_compute(device, (16 << 20) if args.smoke else (128 << 20))
    failures = []
    g = r["grouped_gemm"]
    if g["grouped_available"] and not g["rel_err_grouped_vs_loop"] < 1e-2:
        failures.append(f"grouped GEMM differs from the loop: rel. error {g['rel_err_grouped_vs_loop']:.2e}")
    if g["grouped_available"] and g.get("syncs_per_call", 0):
        failures.append(f"experts_forward made {g['syncs_per_call']} synchronizing calls")
    if r["expert_rows"]["rows_copied_right"] is False:
        failures.append("row-by-row copy wrote wrong bytes")
    c = r.get("copy_during_compute")
    if c and not c["pinned"]["copy_inside_compute_window"]:
        failures.append("a pinned copy on a side stream did not run inside the compute window")
    r["ok"], r["failures"] = not failures, failures
    text = json.dumps(r, indent=1)
    if args.json:
        args.json.write_text(text)
    md = markdown(r)
    if args.md:
        args.md.write_text(md)
    print(md)
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
