"""A live policy matrix replayed in the simulator, scenario by scenario (issue 31 part 3).

``python -m sgl_moe.policy_bench --matrix`` writes what live workers did; this replays each of its scenarios on
simulated workers with everything the live run fixed:

* **the stream**: the same prefix groups drawn in the same order from the same seed (``PrefixUnits`` draws them
  exactly as ``policy_bench.prefix_stream`` does), the same prefix and suffix lengths and request count, or the
  same Table-2 mix tasks (``sgl_moe.workloads``, its lengths as the simulator's units count them);
* **the arrivals**: bulk (everything at t=0), the live run's closed-loop clients, or Poisson at the rate the live
  run offered;
* **the workers**: as many, each with the live KV pool (``--max-total-tokens``), and the Θ and request overhead
  the router installed on them: the medians of the live workers' calibrations (``calibration_pool``); they
  share the live machine's cores as ``policy_bench`` ran them (``cpu_share`` threads each: 3 one-thread workers
  on 2 cores compute at full speed two at a time, ``Calibration.shared_compute``);
* **the routers**: the project's router code for ``longest_block_match`` and ``round_robin`` with the live
  router's settings (its defaults and the matrix's ``--router-args``: holds, hold-to-spill, affinity wait),
  the simulator's model of sglang-router for ``cache_aware``.

Compared per scenario: each router's req/s ratio to ``cache_aware`` and to ``round_robin``, live (the median the
matrix judged) and simulated, and their relative difference; cached fractions side by side. The timing model is
a fit (``fit_timing``) of one of the same workers; absolute req/s are reported but the check is the ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from sgl_moe.policy_bench import scenarios as live_scenarios
from sgl_moe.router.config import RouterConfig
from sgl_moe.simulator.experiments import freeze, run_one
from sgl_moe.simulator.prefix_units import PrefixStreamConfig, PrefixUnits
from sgl_moe.simulator.simulation import SimConfig, SimResult
from sgl_moe.simulator.timing_model import Calibration
from sgl_moe.workloads import WORKLOADS, WorkloadConfig

Progress = Callable[[str], None]

TOLERANCE = 0.10
"""Issue 31: a simulated ratio within 10% of the live one."""
POLICIES = ("longest_block_match", "cache_aware", "round_robin")
SHORT = {"longest_block_match": "lbm", "cache_aware": "ca", "round_robin": "rr"}
RATIOS = (("longest_block_match", "cache_aware"), ("longest_block_match", "round_robin"))
ROUTER_SETTINGS = ("prefix_wait_s", "hold_spills", "max_affinity_wait_s", "pending_ttl_s")
"""Router options the simulation runs as the live router had them (``SimConfig`` fields of the same names)."""
UNRECORDED_DEFAULTS = ("--prefix-wait-s", "0")
"""The router's defaults that have moved since matrices began, as flags, for a matrix that did not record its
router's settings (``router_config``): every such matrix ran before holds became the default (2026-11-26)."""
MIX_CONTEXT = 4096
"""The context length the live matrix clipped the mix by when a worker reported none (``policy_bench.matrix``)."""


@dataclass(frozen=True)
class LiveWorkers:
    """What the live matrix's workers were, as the router saw them."""

    count: int
    pool_tokens: int
    theta_flops: float
    request_overhead_flops: float
    cpus: int
    """Cores of the machine the live workers shared."""
    router: dict[str, Any]
    """The live router's settings the simulation takes (``ROUTER_SETTINGS``): its defaults and the matrix's
    ``--router-args`` (whose ``--saturation-flops`` and ``--request-overhead-flops`` pin Θ and the overhead)."""

    @property
    def shared_compute(self) -> float:
        """Workers computing at full speed at once: ``cpus`` over each worker's threads (``cpu_share``)."""
        return self.cpus / max(1, self.cpus // self.count)

    @classmethod
    def of(cls, matrix: dict[str, Any]) -> LiveWorkers:
        thetas = matrix.get("worker_theta") or []
        flops = [t["flops"] for t in thetas if t.get("flops")]
        overheads = [t.get("request_overhead_flops") or 0.0 for t in thetas]
        if not flops:
            raise ValueError("the matrix JSON lists no worker Θ (worker_theta): it predates this check")
        argv = (matrix.get("router_args") or "").split()
        cfg = RouterConfig.from_argv(argv if "router_config" in matrix else [*UNRECORDED_DEFAULTS, *argv])
        recorded = matrix.get("router_config") or {}
        theta = cfg.saturation_flops or statistics.median(flops)  # the router's pins win, as in the router
        overhead = cfg.request_overhead_flops
        if overhead is None:
            overhead = statistics.median(overheads) if overheads else 0.0
        return cls(count=int(matrix["workers"]), pool_tokens=int(matrix["sizes"]["pool_tokens"]),
                   theta_flops=theta, request_overhead_flops=overhead,
                   cpus=int((matrix.get("machine") or {}).get("cpus") or 1),
                   router={name: recorded.get(name, getattr(cfg, name)) for name in ROUTER_SETTINGS})


def live_sizes(matrix: dict[str, Any]) -> live_scenarios.Sizes:
    known = {f for f in live_scenarios.Sizes.__dataclass_fields__}
    return live_scenarios.Sizes(**{k: v for k, v in matrix["sizes"].items() if k in known})


def scenario_units(entry: dict[str, Any], sizes: live_scenarios.Sizes, seed: int, cal: Calibration):
    """The scenario's stream as the live run drew it."""
    scn = next((s for s in live_scenarios.MATRIX if s.name == entry["name"]), None)
    if scn is None:
        raise ValueError(f"scenario {entry['name']!r} is not in policy_bench's matrix")
    if scn.stream == "mix":
        cfg = WorkloadConfig(workloads=WORKLOADS, requests=sizes.mix_tasks, length_scale=sizes.mix_length_scale,
                             seed=seed, max_context=min(MIX_CONTEXT - 200, sizes.pool_tokens - 200))
        return freeze(cal, cfg)
    live = scn.prefix_stream(sizes, seed, int(entry["stream"]["requests"]))
    return PrefixUnits(PrefixStreamConfig(**asdict(live)), page=cal.page_size)


def scenario_config(entry: dict[str, Any], sizes: live_scenarios.Sizes, workers: LiveWorkers, base: SimConfig,
                    policy: str) -> SimConfig:
    cfg = replace(base, workers=workers.count, policy=policy, theta_flops=workers.theta_flops,
                  request_overhead_flops=workers.request_overhead_flops, **workers.router)
    if entry["arrival"] == "bulk":
        return replace(cfg, arrival="offline")
    if entry["arrival"] == "closed":
        clients = sizes.mix_clients if entry["popularity"] == "mix" else sizes.clients
        return replace(cfg, arrival="closed", concurrency=clients)
    return replace(cfg, arrival="open", rate=float(entry["offered_rps"]))


def live_steps(row: dict[str, Any]) -> float | None:
    """Requests per prefill step the live workers logged, the median over the row's runs (``worker_steps``;
    None for a matrix that did not record them)."""
    per = [run["worker_steps"]["requests_per_step"] for run in row.get("runs", [])
           if (run.get("worker_steps") or {}).get("requests_per_step")]
    return statistics.median(per) if per else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _diff(sim: float | None, live: float | None) -> float | None:
    return sim / live - 1 if sim is not None and live else None


def replay_scenario(entry: dict[str, Any], sizes: live_scenarios.Sizes, workers: LiveWorkers, seed: int,
                    cal: Calibration, base: SimConfig) -> dict[str, Any]:
    """Every policy of ``POLICIES`` on the scenario's stream; live and simulated figures side by side."""
    cal = replace(cal, cache_tokens=workers.pool_tokens, shared_compute=workers.shared_compute)
    units = scenario_units(entry, sizes, seed, cal)
    live = {r["policy"]: r for r in entry["results"]}
    sim: dict[str, SimResult] = {p: run_one(scenario_config(entry, sizes, workers, base, p), cal, units)
                                 for p in POLICIES if p in live}
    rows = []
    for p, r in sim.items():
        stats = live[p].get("router_stats") or {}
        rows.append({"policy": p, "live_rps": live[p]["throughput_rps"], "sim_rps": r.throughput_rps,
                     "live_cached": live[p]["cached_fraction"], "sim_cached": r.cached_fraction,
                     "live_units": live[p].get("tasks"), "sim_units": r.units,
                     "live_prompt_tokens": live[p].get("prompt_tokens"), "sim_prompt_tokens": r.prompt_tokens,
                     "live_predicted_cached": stats.get("predicted_cached_tokens"),
                     "live_reported_cached": stats.get("reported_cached_tokens"),
                     "sim_predicted_cached": r.predicted_cached_tokens, "sim_reported_cached": r.cached_tokens,
                     "live_requests_per_step": live_steps(live[p]), "sim_requests_per_step": r.units / r.steps
                     if r.steps else None, "sim_steps": r.steps,
                     "sim_evicted_pages": r.extra.get("evicted_pages"),
                     "sim_p99_s": r.latency_p99_s})
    by = {row["policy"]: row for row in rows}
    ratios = []
    for a, b in RATIOS:
        if a in by and b in by:
            lr = _ratio(by[a]["live_rps"], by[b]["live_rps"])
            sr = _ratio(by[a]["sim_rps"], by[b]["sim_rps"])
            runs = (entry.get("verdict") or {}).get("runs_rps_vs_cache_aware") if b == "cache_aware" else None
            d = _diff(sr, lr)
            ratios.append({"of": a, "to": b, "live": lr, "sim": sr, "difference": d,
                           "within": d is not None and abs(d) <= TOLERANCE, "live_runs": runs})
    return {"name": entry["name"], "arrival": entry["arrival"], "popularity": entry["popularity"],
            "pool": entry["pool"], "rows": rows, "ratios": ratios}


def replay_matrix(matrix: dict[str, Any], cal: Calibration, base: SimConfig, scenarios: list[str] | None = None,
                  progress: Progress = lambda s: None) -> dict[str, Any]:
    sizes = live_sizes(matrix)
    workers = LiveWorkers.of(matrix)
    seed = int(matrix.get("seed", 0))
    out = []
    for entry in matrix["scenarios"]:
        if scenarios and entry["name"] not in scenarios:
            continue
        result = replay_scenario(entry, sizes, workers, seed, cal, base)
        out.append(result)
        progress(entry["name"] + ": " + "; ".join(
            f"{SHORT[r['of']]}/{SHORT[r['to']]} live {_f(r['live'], '.2f')}x sim {_f(r['sim'], '.2f')}x"
            for r in result["ratios"]))
    checked = [r for s in out for r in s["ratios"] if r["difference"] is not None]
    return {"workers": asdict(workers), "calibration": cal.name, "tolerance": TOLERANCE,
            "simulation": {k: v for k, v in asdict(base).items() if k not in ("workers", "policy")},
            "scenarios": out, "within": sum(r["within"] for r in checked), "checked": len(checked)}


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)



def markdown(result: dict[str, Any], title: str) -> str:
    w = result["workers"]
    lines = [f"# {title}", "",
             f"{w['count']} workers, KV pool {w['pool_tokens']} tokens, Θ {w['theta_flops']:.3g} FLOPs and request "
             f"overhead {w['request_overhead_flops']:.3g} FLOPs (the live workers' medians), sharing {w['cpus']} "
             f"cores; calibration "
             f"{result['calibration']}. A simulated ratio counts as agreeing within {result['tolerance']:.0%} of "
             f"the live one; {result['within']} of {result['checked']} do.", "",
             "| scenario | ratio | live | simulated | difference | live cached lbm / ca / rr | "
             "simulated cached lbm / ca / rr |", "|---|---|---|---|---|---|---|"]
    for s in result["scenarios"]:
        by = {r["policy"]: r for r in s["rows"]}
        live_c = " / ".join(_f(by[p]["live_cached"], ".3f") if p in by else "-" for p in POLICIES)
        sim_c = " / ".join(_f(by[p]["sim_cached"], ".3f") if p in by else "-" for p in POLICIES)
        for i, r in enumerate(s["ratios"]):
            runs = r.get("live_runs")
            live = _f(r["live"], ".2f") + "x" + (f" (runs {min(runs):.2f}–{max(runs):.2f})" if runs else "")
            mark = "" if r["within"] else " **off**"
            lines.append(f"| {s['name'] if i == 0 else ''} | {SHORT[r['of']]}/{SHORT[r['to']]} | {live} | "
                         f"{_f(r['sim'], '.2f')}x | {_f(r['difference'], '+.0%')}{mark} | "
                         f"{live_c if i == 0 else ''} | {sim_c if i == 0 else ''} |")
    lines += ["", "Absolute req/s, live / simulated; requests per prefill step, live (the workers' logs) / simulated; "
              "the router's predicted cached tokens over those reported, live / simulated:", "",
              "| scenario | req/s lbm | ca | rr | requests per step lbm | ca | rr | predicted / reported lbm |",
              "|---|---|---|---|---|---|---|---|"]
    for s in result["scenarios"]:
        by = {r["policy"]: r for r in s["rows"]}
        cells = [f"{by[p]['live_rps']:.2f} / {by[p]['sim_rps']:.2f}" if p in by else "-" for p in POLICIES]
        cells += [f"{_f(by[p]['live_requests_per_step'], '.1f')} / {_f(by[p]['sim_requests_per_step'], '.1f')}"
                  if p in by else "-" for p in POLICIES]
        lbm = by.get("longest_block_match", {})
        cells.append(f"{_f(_diff(lbm.get('live_predicted_cached'), lbm.get('live_reported_cached')), '+.1%')} / "
                     f"{_f(_diff(lbm.get('sim_predicted_cached'), lbm.get('sim_reported_cached')), '+.1%')}")
        lines.append(f"| {s['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
