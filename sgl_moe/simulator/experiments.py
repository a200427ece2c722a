"""The simulator's three experiments: policies at several worker counts, the Θ sweep, and the CPU check.

* ``compare_policies``: each policy on the same stream at each worker count.
* ``theta_sweep`` (seed 000 Fig. 10's shape): weight transfers every forward pass must hide; the
  router with Θ admission at Θ = f x Θ* (Θ* = the FLOPs whose compute lasts one transfer) against
  the same router placing everything at once, and against round robin placing everything at once
  (the count-balancing default of an engine's data-parallel dispatcher).
* ``compare_bench``: the CPU benchmark's stream (``python -m sgl_moe.policy_bench``'s JSON) at its
  worker count and client concurrency with the ``cpu_tiny`` calibration; relative error per policy
  and whether the policies come out in the same order.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sgl_moe.simulator.simulation import SimConfig, SimResult, Simulation
from sgl_moe.simulator.timing_model import Calibration
from sgl_moe.simulator.units import FrozenUnits, TokenIds, UnitStream
from sgl_moe.workloads import WORKLOADS, WorkloadConfig

Progress = Callable[[str], None]


def freeze(cal: Calibration, stream_cfg: WorkloadConfig, token_ids: TokenIds = "derived",
           progress: Progress = lambda s: None) -> FrozenUnits:
    """The stream, generated and hashed once for all the runs of an experiment."""
    t0 = time.perf_counter()
    enabled = gc.isenabled()
    gc.disable()  # millions of long-lived lists and ints: generational collections would rescan them all
    try:
        units = FrozenUnits(UnitStream(stream_cfg, page=cal.page_size, token_ids=token_ids))
    finally:
        if enabled:
            gc.enable()
    gc.freeze()  # the stream lives as long as the experiment: later collections need not scan it
    units.seconds = time.perf_counter() - t0
    progress(f"stream: {units.tasks:,} tasks -> {units.units:,} prefill requests, {units.prompt_tokens / 1e6:.1f}M "
             f"prompt tokens, oracle cached {units.oracle_cached / units.prompt_tokens:.3f} "
             f"({units.seconds:.1f} s to generate and hash)")
    return units


def run_one(cfg: SimConfig, cal: Calibration, units: FrozenUnits | WorkloadConfig) -> SimResult:
    if isinstance(units, WorkloadConfig):
        units = UnitStream(units, page=cal.page_size)
    return Simulation(cfg, cal, units).run()


def compare_policies(cal: Calibration, stream_cfg: WorkloadConfig, workers: Sequence[int], policies: Sequence[str],
                     base: SimConfig, token_ids: TokenIds = "derived",
                     progress: Progress = lambda s: None) -> dict[int, list[SimResult]]:
    units = freeze(cal, stream_cfg, token_ids, progress)
    out: dict[int, list[SimResult]] = {}
    for n, policy in itertools.product(workers, policies):
        r = run_one(replace(base, workers=n, policy=policy), cal, units)
        r.extra["stream_seconds"] = units.seconds  # generated and hashed once per command, shared by every run
        out.setdefault(n, []).append(r)
        progress(f"{n} workers, {policy}: {r.throughput_rps:.1f} req/s, cached {r.cached_fraction:.3f}, "
                 f"{r.wall_seconds:.1f} s wall")
    return out


def theta_sweep(cal: Calibration, stream_cfg: WorkloadConfig, workers: int, factors: Sequence[float], base: SimConfig,
                progress: Progress = lambda s: None) -> list[dict[str, Any]]:
    """Rows of the Fig. 10 shape; ``base.transfer`` says which transfer must be hidden."""
    theta_star = cal.hidden_theta(base.transfer)
    if theta_star <= 0:
        raise ValueError("the Θ sweep needs weight transfers to hide: --transfer nvlink or pcie")
    tokens_per_theta = cal.flops.linear_flops_per_token
    units = freeze(cal, stream_cfg, progress=progress)
    rows = []
    runs = [("longest_block_match", f, True) for f in factors]
    runs += [("longest_block_match", None, False), ("round_robin", None, False)]
    for policy, f, admission in runs:
        cfg = replace(base, workers=workers, policy=policy, admission=admission,
                      theta_flops=theta_star * f if f is not None else None)
        r = run_one(cfg, cal, units)
        row = {"policy": policy, "admission": admission, "theta_factor": f,
               "theta_flops": theta_star * f if f is not None else None,
               "theta_tokens": theta_star * f / tokens_per_theta if f is not None else None,
               "throughput_rps": r.throughput_rps, "prompt_tokens_per_s": r.prompt_tokens_per_s,
               "cached_fraction": r.cached_fraction, "mean_step_tokens": r.mean_step_tokens,
               "transfer_bound_steps": r.transfer_bound_steps / r.steps if r.steps else 0.0,
               "latency_p50_s": r.latency_p50_s, "latency_p99_s": r.latency_p99_s, "sim_seconds": r.sim_seconds,
               "wall_seconds": r.wall_seconds}
        rows.append(row)
        progress(f"Θ sweep {policy} {'Θ=' + format(f, 'g') + 'Θ*' if f is not None else 'no admission'}: "
                 f"{r.throughput_rps:.1f} req/s")
    return rows


def sweep_table(rows: list[dict[str, Any]], theta_star: float, transfer: str, workers: int) -> str:
    head = (f"{'placement':<40} {'Θ/Θ*':>6} {'Θ tokens':>9} {'req/s':>9} {'cached':>7} {'step tok':>9} "
            f"{'xfer-bound':>10} {'p50 s':>8}")
    lines = [f"Θ sweep: {workers} workers, {transfer} transfers hidden per forward pass, Θ* = {theta_star:.3g} FLOPs",
             head, "-" * len(head)]
    for r in rows:
        name = (f"sgl_moe {r['policy']} + Θ admission" if r["admission"]
                else f"{r['policy']}, everything placed at once")
        f = f"{r['theta_factor']:g}" if r["theta_factor"] is not None else "-"
        tok = f"{r['theta_tokens']:.0f}" if r["theta_tokens"] is not None else "-"
        lines.append(f"{name:<40} {f:>6} {tok:>9} {r['throughput_rps']:>9.1f} {r['cached_fraction']:>7.3f} "
                     f"{r['mean_step_tokens']:>9.0f} {r['transfer_bound_steps']:>10.2f} {r['latency_p50_s']:>8.3f}")
    return "\n".join(lines)


def bench_setup(bench: dict[str, Any] | list[dict[str, Any]]) -> tuple[list[dict[str, Any]], WorkloadConfig, int, int]:
    """Rows, stream, worker count and client concurrency of a CPU benchmark JSON (policy_bench's, or a bare list)."""
    if isinstance(bench, list):
        rows, config = bench, {}
    else:
        rows, config = bench.get("results", []), bench.get("config", {})
    names = config.get("workloads", "mix")
    workloads = WORKLOADS if names in ("mix", None) else tuple(names.split(",") if isinstance(names, str) else names)
    workers = config.get("workers") or (len(bench.get("workers", [])) if isinstance(bench, dict) else 0) or 3
    if isinstance(workers, list):
        workers = len(workers)
    stream = WorkloadConfig(workloads=workloads, requests=int(config.get("requests", 400)),
                            length_scale=float(config.get("length_scale", 8.0)), seed=int(config.get("seed", 0)),
                            max_context=int(config.get("max_context", 4096 - 200)))
    return rows, stream, int(workers), int(config.get("concurrency", 32))


def compare_bench(bench: dict[str, Any] | list[dict[str, Any]], cal: Calibration, base: SimConfig,
                  progress: Progress = lambda s: None) -> dict[str, Any]:
    rows, stream, workers, concurrency = bench_setup(bench)
    units = freeze(cal, stream, progress=progress)
    out = []
    for row in rows:
        policy = row["policy"]
        cfg = replace(base, workers=workers, policy=policy, arrival="closed", concurrency=concurrency)
        r = run_one(cfg, cal, units)
        out.append({"policy": policy, "bench_rps": row["throughput_rps"], "sim_rps": r.throughput_rps,
                    "rps_error": r.throughput_rps / row["throughput_rps"] - 1 if row["throughput_rps"] else None,
                    "bench_cached": row.get("cached_fraction"), "sim_cached": r.cached_fraction,
                    "cached_error": (r.cached_fraction - row["cached_fraction"])
                    if row.get("cached_fraction") is not None else None,
                    "sim_units": r.units, "bench_units": row.get("requests")})
        progress(f"compare {policy}: bench {row['throughput_rps']:.2f} req/s, sim {r.throughput_rps:.2f}")
    order_bench = [r["policy"] for r in sorted(out, key=lambda r: -r["bench_rps"])]
    order_sim = [r["policy"] for r in sorted(out, key=lambda r: -r["sim_rps"])]
    errors = [abs(r["rps_error"]) for r in out if r["rps_error"] is not None]
    return {"workers": workers, "concurrency": concurrency, "requests": stream.requests, "rows": out,
            "order_bench": order_bench, "order_sim": order_sim, "order_matches": order_bench == order_sim,
            "mean_abs_rps_error": sum(errors) / len(errors) if errors else None}


def compare_table(result: dict[str, Any]) -> str:
    head = f"{'policy':<22} {'bench req/s':>11} {'sim req/s':>10} {'error':>7} {'bench cached':>12} {'sim cached':>10}"
    lines = [f"CPU benchmark vs simulator ({result['workers']} workers, concurrency {result['concurrency']}, "
             f"{result['requests']} tasks)", head, "-" * len(head)]
    for r in result["rows"]:
        bc = f"{r['bench_cached']:.3f}" if r["bench_cached"] is not None else "-"
        lines.append(f"{r['policy']:<22} {r['bench_rps']:>11.2f} {r['sim_rps']:>10.2f} {r['rps_error']:>+7.1%} "
                     f"{bc:>12} {r['sim_cached']:>10.3f}")
    lines.append(f"order by throughput: bench {' > '.join(result['order_bench'])}")
    lines.append(f"                     sim   {' > '.join(result['order_sim'])}")
    lines.append(f"ordering matches: {'yes' if result['order_matches'] else 'no'}; mean |error| "
                 f"{result['mean_abs_rps_error']:.1%}" if result["mean_abs_rps_error"] is not None else "")
    return "\n".join(lines)
