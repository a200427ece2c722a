"""The scenario matrix (``scenarios``) at several worker counts, every policy side by side on the same units.

Per worker count and scenario, each policy runs the same stream on fresh workers (empty caches). Reported
per policy: req/s, cached fraction, p50/p99 latency, and the ratios to ``cache_aware`` (sglang-router's
model) and ``round_robin``; for ``longest_block_match`` whether it meets issue 18's goal (``GOAL``) and by
how much it misses. ``markdown`` renders the tables the README takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sgl_moe.simulator.experiments import freeze, run_one
from sgl_moe.simulator.prefix_units import PrefixStreamConfig, PrefixUnits
from sgl_moe.simulator.scenarios import FULL, Scenario, Sizes
from sgl_moe.simulator.simulation import SimConfig, SimResult
from sgl_moe.simulator.timing_model import Calibration
from sgl_moe.workloads import WorkloadConfig

MATRIX_POLICIES = ("longest_block_match", "round_robin", "least_flops", "cache_aware")
UNBOUNDED_TOKENS = 10**12
"""KV pool of a worker in ``unbounded`` scenarios: nothing is ever evicted."""
GOAL = {"rps_vs_cache_aware": 1.1, "rps_vs_round_robin": 1.3, "p99_vs_cache_aware": 1.2}
"""Issue 18: >= 1.1x cache_aware and >= 1.3x round robin in req/s, cached fraction >= cache_aware's, p99
no worse than 1.2x cache_aware's."""
SHORT = {"longest_block_match": "lbm", "round_robin": "rr", "least_flops": "lf", "cache_aware": "ca",
         "power_of_two": "p2"}

Progress = Callable[[str], None]


def scenario_calibration(scn: Scenario, cal: Calibration, sizes: Sizes) -> Calibration:
    if scn.pool == "unbounded":
        return replace(cal, cache_tokens=UNBOUNDED_TOKENS)
    return replace(cal, cache_tokens=sizes.pool_tokens) if sizes.pool_tokens else cal


def scenario_units(scn: Scenario, sizes: Sizes, workers: int, cal: Calibration, seed: int,
                   progress: Progress = lambda s: None):
    """The scenario's stream at this worker count (the same for both pools and every arrival)."""
    n = sizes.requests(workers)
    if scn.stream == "mix":
        return freeze(cal, WorkloadConfig(requests=n, length_scale=sizes.mix_length_scale, seed=seed),
                      progress=progress)
    return PrefixUnits(PrefixStreamConfig(requests=n, groups=sizes.groups(sizes.pool_tokens or cal.cache_tokens),
                                          prefix_tokens=sizes.prefix_tokens, suffix_tokens=sizes.suffix_tokens,
                                          popularity=scn.stream, seed=seed), page=cal.page_size)


def scenario_config(scn: Scenario, base: SimConfig, sizes: Sizes, workers: int, policy: str,
                    capacity: float | None) -> SimConfig:
    cfg = replace(base, workers=workers, policy=policy)
    if scn.arrival == "bulk":
        return replace(cfg, arrival="offline")
    if scn.arrival == "closed":
        return replace(cfg, arrival="closed", concurrency=sizes.clients(workers))
    if not capacity:
        raise ValueError(f"{scn.name}: no capacity measured in {scn.capacity_from} (run it first)")
    return replace(cfg, arrival="open", rate=scn.load * capacity)


def row(r: SimResult) -> dict[str, Any]:
    return {"policy": r.policy, "throughput_rps": r.throughput_rps, "cached_fraction": r.cached_fraction,
            "latency_p50_s": r.latency_p50_s, "latency_p99_s": r.latency_p99_s, "units": r.units,
            "rejected": r.rejected, "spills": r.spills, "sim_seconds": r.sim_seconds,
            "oracle_fraction": r.oracle_fraction, "busy_fraction": r.busy_fraction,
            "wall_seconds": r.wall_seconds, "cpu_seconds": r.cpu_seconds}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Ratios of every row to cache_aware's and round robin's; the goal check for longest_block_match."""
    by = {r["policy"]: r for r in rows}
    ca, rr = by.get("cache_aware"), by.get("round_robin")
    for r in rows:
        r["rps_vs_cache_aware"] = r["throughput_rps"] / ca["throughput_rps"] if ca and ca["throughput_rps"] else None
        r["rps_vs_round_robin"] = r["throughput_rps"] / rr["throughput_rps"] if rr and rr["throughput_rps"] else None
        r["cached_minus_cache_aware"] = r["cached_fraction"] - ca["cached_fraction"] if ca else None
        r["p99_vs_cache_aware"] = r["latency_p99_s"] / ca["latency_p99_s"] if ca and ca["latency_p99_s"] else None
    lbm = by.get("longest_block_match")
    if lbm is not None and ca is not None and rr is not None:
        misses = []
        if lbm["rps_vs_cache_aware"] is not None and lbm["rps_vs_cache_aware"] < GOAL["rps_vs_cache_aware"]:
            misses.append(f"req/s {lbm['rps_vs_cache_aware']:.2f}x ca < {GOAL['rps_vs_cache_aware']}")
        if lbm["rps_vs_round_robin"] is not None and lbm["rps_vs_round_robin"] < GOAL["rps_vs_round_robin"]:
            misses.append(f"req/s {lbm['rps_vs_round_robin']:.2f}x rr < {GOAL['rps_vs_round_robin']}")
        if lbm["cached_minus_cache_aware"] < -1e-9:
            misses.append(f"cached {lbm['cached_minus_cache_aware']:+.3f} vs ca")
        if lbm["p99_vs_cache_aware"] is not None and lbm["p99_vs_cache_aware"] > GOAL["p99_vs_cache_aware"]:
            misses.append(f"p99 {lbm['p99_vs_cache_aware']:.2f}x ca > {GOAL['p99_vs_cache_aware']}")
        lbm["goal_met"] = not misses
        lbm["goal_misses"] = misses


def run_matrix(cal: Calibration, base: SimConfig, workers: Sequence[int], scenarios: Sequence[Scenario],
               policies: Sequence[str] = MATRIX_POLICIES, sizes: Sizes = FULL,
               progress: Progress = lambda s: None,
               done: Callable[[list[dict[str, Any]]], None] = lambda entries: None) -> list[dict[str, Any]]:
    """One entry per (worker count, scenario): its description, sizes and one row per policy. ``done`` is
    called with the entries so far after each scenario (the CLI rewrites its files: a long run keeps what
    it finished)."""
    out: list[dict[str, Any]] = []
    for n in workers:
        streams: dict[str, Any] = {}
        capacity: dict[str, float] = {}
        for scn in scenarios:
            scal = scenario_calibration(scn, cal, sizes)
            units = streams.get(scn.stream)
            if units is None:
                t0 = time.perf_counter()
                units = streams[scn.stream] = scenario_units(scn, sizes, n, cal, base.seed)
                progress(f"{n} workers: {scn.stream} stream of {units.units:,} requests "
                         f"({time.perf_counter() - t0:.1f} s)")
            rows = []
            for policy in policies:
                cfg = scenario_config(scn, base, sizes, n, policy, capacity.get(scn.capacity_from))
                r = run_one(cfg, scal, units)
                rows.append(row(r))
                progress(f"{n} workers, {scn.name}, {policy}: {r.throughput_rps:.1f} req/s, cached "
                         f"{r.cached_fraction:.3f}, p99 {r.latency_p99_s:.3f} s ({r.wall_seconds:.1f} s wall)")
            if scn.arrival == "bulk":
                capacity[scn.name] = max(r["throughput_rps"] for r in rows)
            add_ratios(rows)
            entry = {"workers": n, "scenario": scn.name, "describe": scn.describe(), "stream": scn.stream,
                     "pool": scn.pool, "arrival": scn.arrival, "load": scn.load or None,
                     "requests": units.units, "oracle_fraction": units.oracle_cached / units.prompt_tokens,
                     "pool_tokens": scal.cache_tokens, "rows": rows}
            if scn.arrival == "closed":
                entry["clients"] = sizes.clients(n)
            if scn.arrival == "open":
                entry["rate_rps"] = scn.load * capacity[scn.capacity_from]
            out.append(entry)
            done(out)
    return out


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(entries: list[dict[str, Any]], title: str) -> str:
    """One table per worker count: a row per scenario, longest_block_match against the others."""
    lines = [title, ""]
    for n in dict.fromkeys(e["workers"] for e in entries):
        policies = [r["policy"] for r in next(e for e in entries if e["workers"] == n)["rows"]]
        names = " / ".join(SHORT.get(p, p) for p in policies)
        lines += [f"**{n} workers** (req/s, cached fraction and p99 latency as {names}; ratios of "
                  "longest_block_match)", "",
                  f"| scenario | req/s {names} | lbm ×ca | lbm ×rr | cached {names} | p99 s {names} | goal |",
                  "|---|---|---|---|---|---|---|"]
        for e in (e for e in entries if e["workers"] == n):
            rows = e["rows"]
            lbm = next((r for r in rows if r["policy"] == "longest_block_match"), None)
            goal = "-" if lbm is None or "goal_met" not in lbm else (
                "met" if lbm["goal_met"] else "missed: " + "; ".join(lbm["goal_misses"]))
            lines.append(
                f"| {e['scenario']} | {' / '.join(_f(r['throughput_rps'], '.4g') for r in rows)} "
                f"| {_f(lbm and lbm['rps_vs_cache_aware'], '.2f')} | {_f(lbm and lbm['rps_vs_round_robin'], '.2f')} "
                f"| {' / '.join(_f(r['cached_fraction'], '.3f') for r in rows)} "
                f"| {' / '.join(_f(r['latency_p99_s'], '.3g') for r in rows)} | {goal} |")
        lines.append("")
    return "\n".join(lines)


def summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """How many scenarios meet the goal, per worker count."""
    out: dict[str, Any] = {}
    for e in entries:
        lbm = next((r for r in e["rows"] if r["policy"] == "longest_block_match"), None)
        if lbm is None or "goal_met" not in lbm:
            continue
        s = out.setdefault(str(e["workers"]), {"scenarios": 0, "goal_met": 0})
        s["scenarios"] += 1
        s["goal_met"] += bool(lbm["goal_met"])
    return out
