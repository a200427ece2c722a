"""``python -m sgl_moe.overlap.bench``: dual micro-batch attention–MoE overlap against running in turn.

Torch only (no SGLang). Layers shaped like Qwen3-30B-A3B (hidden 2048, 128 experts of width 768, top-8,
GQA 32/4; random weights; 4 layers by default so it fits anywhere), two placements:
- ``cpu-experts`` (seed 004 Fig. 7), decode: attention on the device, routed experts on the CPU in a worker
  thread. Baseline: the same placement as one batch (device and CPU alternate, each idle half the time).
  Rows per batch B: measured per-layer T_a and T_m, the bound min(T_a, T_m)/(T_a + T_m), the solver's plan,
  step time overlapped vs in turn. Seed 004's view compares *double* concurrency overlapped with the
  baseline: throughput 2B/T_dual(2B) vs B/T_seq(B), and per-request latency T_dual(2B) vs T_seq(B).
- ``streams``, prefill: attention and experts on two CUDA streams of one GPU; baseline the ``sequential``
  placement (one stream); η (overlap efficiency of concurrent kernels) measured from the two halves.
Each run is checked: overlapped output == the same micro-batches run serially (bit for bit), and its
difference from the unsplit batch is reported. CUDA events on a GPU, perf_counter on a CPU, median of
``--reps``. On a CPU both placements are emulated by threads (``engine``): times say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from sgl_moe.offload.decode_stack import DecodeStack
from sgl_moe.overlap.costs import CostModel, Sample, measure, time_call
from sgl_moe.overlap.engine import DualBatchRunner
from sgl_moe.overlap.layers import DecodeLayers, PrefillLayers
from sgl_moe.overlap.solver import Plan, Solver
from sgl_moe.streaming.host_cpus import host_cpus, usable_cpus
from sgl_moe.streaming.moe_stack import MoEStack, MoEStackConfig

BENCH_PLACEMENTS = ("cpu-experts", "streams")


def _plan_dict(plan: Plan) -> dict:
    return {"point": plan.split.point, "order": plan.order, "overlap": plan.overlap, "reason": plan.reason,
            "predicted_makespan_s": plan.predicted_makespan, "predicted_sequential_s": plan.predicted_sequential,
            "predicted_gain": plan.predicted_gain, "bound": plan.bound}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def solver_speed(model: CostModel, layers: int, batch: int = 256, solves: int = 50) -> float:
    """Median seconds of an uncached solve for ``batch`` decode sequences of random contexts."""
    rng = random.Random(0)
    solver = Solver(model, layers, "cpu-experts")
    times = []
    for _ in range(solves):
        ctx = [rng.randint(16, 32768) for _ in range(batch)]
        t0 = time.perf_counter()
        solver.solve([1] * batch, ctx)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_pair(runner: DualBatchRunner, reference: DualBatchRunner, x: torch.Tensor, plan: Plan, reps: int
             ) -> dict:
    """Times of the batch in turn (``reference``, no plan) and overlapped (``runner`` with ``plan``)."""
    device = runner.device
    t_seq = time_call(lambda: reference.run(x), device, reps=reps)
    t_dual = time_call(lambda: runner.run(x, plan), device, reps=reps)
    out = runner.run(x, plan)
    return {"seq_s": t_seq, "dual_s": t_dual, "speedup": t_seq / t_dual,
            "achieved_gain": 1 - t_dual / t_seq,
            "diff_vs_serial_split": _diff(out, runner.run(x, plan, serial=True)),
            "diff_vs_unsplit": _diff(out, reference.run(x))}


def bench_cpu_experts(stack: DecodeStack, batches: list[int], context: int, reps: int, threads: int | None,
                      progress, force: bool = False, eta: float | None = None) -> dict:
    cfg = stack.cfg
    ops = {b: DecodeLayers(stack, [context] * b) for b in batches}
    runners = {b: DualBatchRunner(ops[b], "cpu-experts", expert_threads=threads) for b in batches}
    try:
        samples: list[Sample] = []
        measured, etas = {}, {}
        for b in batches:
            new = measure(runners[b], sorted({max(1, b // 2), b}), reps=reps)
            samples += new
            measured[b] = (new[-2].seconds, new[-1].seconds)
            if eta is not None or b == 1:
                etas[b] = (1.0 if eta is None else eta, "flag" if eta is not None else "batch of 1")
            else:  # a GPU and a CPU share little; two cores of one CPU share its memory bandwidth
                etas[b] = (runners[b].overlap_efficiency(slice(0, b // 2), slice(b // 2, b), reps), "measured")
        model = CostModel.fit(samples)
        rows = []
        for b in batches:
            solver = Solver(model, cfg.layers, "cpu-experts", eta=etas[b][0], force_overlap=force)
            forced = Solver(model, cfg.layers, "cpu-experts", eta=etas[b][0], force_overlap=True)
            plan = solver.plan([1] * b, ops[b].contexts)
            t_a, t_m = measured[b]
            row = {"batch": b, "t_attn_s": t_a, "t_moe_s": t_m, "bound": min(t_a, t_m) / (t_a + t_m),
                   "eta": etas[b][0], "eta_source": etas[b][1],
                   "plan": _plan_dict(plan), **run_pair(runners[b], runners[b], ops[b].inputs(), plan, reps)}
            row["fraction_of_bound"] = row["achieved_gain"] / row["bound"] if row["bound"] > 0 else None
            if not plan.overlap and b > 1:  # check the solver's "off": what the split would have done
                alt = forced.plan([1] * b, ops[b].contexts)
                row["forced"] = {"plan": _plan_dict(alt),
                                 **run_pair(runners[b], runners[b], ops[b].inputs(), alt, reps)}
            rows.append(row)
            progress(f"cpu-experts B={b}: T_a {t_a * 1e3:.3f} ms T_m {t_m * 1e3:.3f} ms eta {etas[b][0]:.2f}, "
                     f"seq {row['seq_s'] * 1e3:.2f}"
                     f" ms, dual {row['dual_s'] * 1e3:.2f} ms (split {plan.split.point}/{b}, {plan.order})")
    finally:
        for r in runners.values():
            r.close()
    by = {r["batch"]: r for r in rows}
    # 2B overlapped vs B in turn mixes two effects; "batching" (2B in turn vs B in turn) and "overlap"
    # (2B overlapped vs 2B in turn) separate them: throughput_ratio = batching × overlap.
    doubled = [{"batch": b, "batch_dual": 2 * b, "overlap": by[2 * b]["plan"]["overlap"],
                "throughput_ratio": 2 * by[b]["seq_s"] / by[2 * b]["dual_s"],
                "batching_ratio": 2 * by[b]["seq_s"] / by[2 * b]["seq_s"],
                "overlap_ratio": by[2 * b]["seq_s"] / by[2 * b]["dual_s"],
                "added_latency": by[2 * b]["dual_s"] / by[b]["seq_s"] - 1} for b in batches if 2 * b in by]
    return {"model": asdict(model), "rows": rows, "doubled": doubled}


def bench_streams(stack: MoEStack, shapes: list[tuple[int, int]], reps: int, eta: float | None, progress,
                  force: bool = False) -> dict:
    cfg, rows = stack.cfg, []
    for b, s in shapes:
        ops = PrefillLayers(stack, b, s)
        runner, reference = DualBatchRunner(ops, "streams"), DualBatchRunner(ops, "sequential")
        try:
            half = max(1, b // 2)
            samples = measure(runner, sorted({half, b}), reps=reps)
            model = CostModel.fit(samples)
            t_a, t_m = samples[-2].seconds, samples[-1].seconds
            eta_used, eta_src = eta, "flag"
            if eta is None:
                if b > 1:
                    eta_used, eta_src = runner.overlap_efficiency(slice(0, half), slice(half, b), reps), "measured"
                else:
                    eta_used, eta_src = 0.0, "batch of 1"
            plan = Solver(model, cfg.layers, "streams", eta=eta_used, force_overlap=force).plan([s] * b, [s] * b)
            row = {"batch": b, "seq": s, "tokens": b * s, "t_attn_s": t_a, "t_moe_s": t_m,
                   "bound": min(t_a, t_m) / (t_a + t_m), "eta": eta_used, "eta_source": eta_src,
                   "plan": _plan_dict(plan), **run_pair(runner, reference, ops.inputs(), plan, reps)}
            row["fraction_of_bound"] = row["achieved_gain"] / row["bound"] if row["bound"] > 0 else None
            rows.append(row)
            progress(f"streams {b}x{s}: T_a {t_a * 1e3:.2f} ms T_m {t_m * 1e3:.2f} ms eta {eta_used:.2f}, "
                     f"seq {row['seq_s'] * 1e3:.2f} ms dual {row['dual_s'] * 1e3:.2f} ms")
        finally:
            runner.close()
            reference.close()
    return {"rows": rows}


def table(result: dict) -> str:
    def ms(v: float) -> str:
        return f"{v * 1e3:.3f}"

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.0f}%"

    def plan(p: dict) -> str:
        return f"{p['point']} {p['order']}" if p["overlap"] else "off"

    cfg = result["config"]
    lines = [f"device {result['device']}, torch {result['torch']}; {cfg['layers']} layers, hidden {cfg['hidden']}, "
             f"{cfg['experts']} experts (top-{cfg['top_k']}, width {cfg['expert_width']}), {cfg['dtype']}; "
             f"solver: median {result['solver_median_us_b256']:.0f} µs per uncached solve (batch 256)"]
    if "cpu-experts" in result:
        r = result["cpu-experts"]
        lines += ["", f"cpu-experts, decode, context {result['context']} (per layer T_a, T_m; per step seq, dual):",
                  "| batch | T_a ms | T_m ms | bound | eta | plan (A size, order) | predicted gain | seq ms | "
                  "dual ms | speedup | gain / bound | diff vs serial split | diff vs unsplit | if split anyway |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in r["rows"]:
            alt = x.get("forced")
            alt_txt = f"{plan(alt['plan'])}: {alt['speedup']:.2f}x" if alt else "-"
            lines.append(f"| {x['batch']} | {ms(x['t_attn_s'])} | {ms(x['t_moe_s'])} | {pct(x['bound'])} | "
                         f"{x['eta']:.2f} ({x['eta_source']}) | "
                         f"{plan(x['plan'])} | {pct(x['plan']['predicted_gain'])} | {ms(x['seq_s'])} | "
                         f"{ms(x['dual_s'])} | {x['speedup']:.2f}x | {pct(x['fraction_of_bound'])} | "
                         f"{x['diff_vs_serial_split']:.3g} | {x['diff_vs_unsplit']:.3g} | {alt_txt} |")
        if r["doubled"]:
            lines += ["", "seed 004's view: two micro-batches of B overlapped vs one batch of B in turn "
                          "(target ≥ 1.3x throughput, ≤ 15% added latency):",
                      "| B | dual batch | overlapped | throughput ratio | = batching (2B vs B in turn) | "
                      "x overlap (2B) | added per-request latency |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {d['batch']} | {d['batch_dual']} | {'yes' if d['overlap'] else 'no (plan off)'} | "
                      f"{d['throughput_ratio']:.2f}x | {d['batching_ratio']:.2f}x | {d['overlap_ratio']:.2f}x | "
                      f"{pct(d['added_latency'])} |"
                      for d in r["doubled"]]
    if "streams" in result:
        lines += ["", "streams, prefill (per layer T_a, T_m; per forward seq, dual):",
                  "| batch x seq | T_a ms | T_m ms | bound | eta | plan | predicted gain | seq ms | dual ms | "
                  "speedup | gain / bound | diff vs serial split | diff vs unsplit |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in result["streams"]["rows"]:
            lines.append(f"| {x['batch']}x{x['seq']} | {ms(x['t_attn_s'])} | {ms(x['t_moe_s'])} | "
                         f"{pct(x['bound'])} | {x['eta']:.2f} ({x['eta_source']}) | {plan(x['plan'])} | "
                         f"{pct(x['plan']['predicted_gain'])} | {ms(x['seq_s'])} | {ms(x['dual_s'])} | "
                         f"{x['speedup']:.2f}x | {pct(x['fraction_of_bound'])} | "
                         f"{x['diff_vs_serial_split']:.3g} | {x['diff_vs_unsplit']:.3g} |")
    if result["device"] == "cpu":
        lines.append("CPU: both placements emulated by threads on shared cores; times and gains say nothing about "
                     "a GPU (physics.md). What carries over: the plans and the exactness columns.")
    return "\n".join(lines)


def _shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        b, s = item.lower().split("x")
        out.append((int(b), int(s)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.overlap.bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny float32 layers and shapes (CPU smoke test, CI)")
    p.add_argument("--placement", default=",".join(BENCH_PLACEMENTS), help="comma-separated: cpu-experts,streams")
    p.add_argument("--batches", help="decode batch sizes for cpu-experts (default 16,32,64,128; tiny 4,8)")
    p.add_argument("--context", type=int, help="KV tokens per decode sequence (default 8192; tiny 64)")
    p.add_argument("--prefill", help="prefill shapes BxS for streams (default 2x4096,4x2048,8x1024; tiny 2x32,4x16)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, help="routed experts per layer (default: the model's); fewer make the "
                   "CPU experts' time comparable to the attention's where a torch CPU kernel is far slower")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                   help="weights and activations (default bfloat16; tiny float32); a CPU without bf16 units runs "
                   "float32 far faster")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (median)")
    p.add_argument("--expert-threads", type=int, help="torch threads of the CPU experts worker "
                   "(default: usable cores - 2 with a GPU, i.e. affinity mask and cgroup quota; 1 in CPU emulation)")
    p.add_argument("--eta", type=float, help="overlap efficiency of the two resources running together; default "
                   "measured per shape")
    p.add_argument("--force-overlap", action="store_true",
                   help="split every batch of 2+ even where the solver predicts no gain (A/B runs, smoke tests)")
    p.add_argument("--json", type=Path, help="write the full result here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available (use --device cpu --tiny for the smoke test)")
    placements = [x for x in args.placement.split(",") if x]
    if not placements or any(x not in BENCH_PLACEMENTS for x in placements):
        p.error(f"--placement takes {BENCH_PLACEMENTS}, got {args.placement!r}")
    try:
        batches = [int(b) for b in (args.batches or ("4,8" if args.tiny else "16,32,64,128")).split(",") if b]
        shapes = _shapes(args.prefill or ("2x32,4x16" if args.tiny else "2x4096,4x2048,8x1024"))
    except ValueError:
        p.error("--batches takes integers, --prefill BxS pairs")
    context = args.context or (64 if args.tiny else 8192)
    if min(batches) < 1 or min(min(s) for s in shapes) < 1 or args.layers < 1 or args.reps < 1 or context < 1:
        p.error("need positive batches, shapes, layers, reps and context")
    if args.eta is not None and not 0 <= args.eta <= 1:
        p.error("--eta must be in [0, 1]")
    cfg = MoEStackConfig.tiny(layers=args.layers) if args.tiny else MoEStackConfig.qwen3_30b_a3b(layers=args.layers)
    if args.experts is not None:
        if not cfg.top_k <= args.experts:
            p.error(f"--experts must be at least top-k ({cfg.top_k})")
        cfg = replace(cfg, experts=args.experts)
    if args.dtype:
        cfg = replace(cfg, dtype=args.dtype)
    # Cores this process may use (affinity mask, cgroup quota), not the host's: a GPU slice of a large machine.
    threads = args.expert_threads or (max(1, usable_cpus() - 2) if device.type == "cuda" else 1)
    if device.type == "cpu":
        torch.set_num_threads(1)  # the emulated "GPU" and the emulated CPU-experts worker get a core each
        if not args.tiny:
            print("warning: full-size layers on a CPU take very long; --tiny is the CPU smoke test", file=sys.stderr)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    result: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "config": asdict(cfg), "context": context,
                    "expert_threads": threads, "host_cpus": host_cpus().as_dict(), "reps": args.reps,
                    "force_overlap": args.force_overlap}
    if "cpu-experts" in placements:
        result["cpu-experts"] = bench_cpu_experts(DecodeStack(cfg, device, context), batches, context, args.reps,
                                                  threads, progress, args.force_overlap, args.eta)
        model = CostModel(**result["cpu-experts"]["model"])
    else:
        model = CostModel(attn_alpha=1e-5, attn_beta=1e-9, attn_gamma=1e-6, moe_alpha=1e-5, moe_beta=1e-5)
    if "streams" in placements:
        result["streams"] = bench_streams(MoEStack(cfg, device), shapes, args.reps, args.eta, progress,
                                          args.force_overlap)
    result["solver_median_us_b256"] = solver_speed(model, cfg.layers) * 1e6
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
