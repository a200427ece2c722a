"""``python -m sgl_moe.simulator``: policies at several worker counts, the Θ sweep, or the CPU-benchmark check.

    python -m sgl_moe.simulator --workers 8 64 256 --requests 1000000 --calibration h100_30b \\
        --policies all --out sim.json
    python -m sgl_moe.simulator --theta-sweep --workers 8 --requests 100000 --transfer nvlink
    python -m sgl_moe.simulator --compare BENCH.json [--calibration cpu_tiny | calibration.json]
    python -m sgl_moe.simulator --compare MATRIX.json --calibration calibration.json --out replay.json
        # a live policy matrix replayed scenario by scenario (live_replay); --out also gets a .md table
    python -m sgl_moe.simulator --matrix [--matrix-size smoke] [--scenarios a,b] \\
        --out benchmarks/results/simulator/matrix.json     # also writes matrix.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from sgl_moe.cli_args import add_dataclass_args
from sgl_moe.simulator import live_replay
from sgl_moe.simulator.experiments import compare_bench, compare_policies, compare_table, sweep_table, theta_sweep
from sgl_moe.simulator.matrix import MATRIX_POLICIES, markdown, run_matrix, summary
from sgl_moe.simulator.report import machine, table
from sgl_moe.simulator.scenarios import FULL, SMOKE, select
from sgl_moe.simulator.sglang_router_model import CacheAwareConfig
from sgl_moe.simulator.simulation import POLICIES, SimConfig
from sgl_moe.simulator.timing_model import PRESETS, load
from sgl_moe.workloads import WORKLOADS, WorkloadConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.simulator", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[8, 64, 256], help="worker counts (default 8 64 256)")
    p.add_argument("--policies", nargs="+", default=["all"], choices=["all", *POLICIES])
    p.add_argument("--calibration", default=None,
                   help=f"a preset ({', '.join(PRESETS)}) or a JSON from python -m sgl_moe.simulator.fit_timing "
                        "(default: cpu_tiny with --compare, else h100_30b)")
    p.add_argument("--requests", type=int, default=100_000, help="workload tasks (a multi task is several prefills)")
    p.add_argument("--workloads", default="mix", help=f"'mix' or comma-separated names from {','.join(WORKLOADS)}")
    p.add_argument("--length-scale", type=float, default=8.0, help="divide Table 2 context lengths by this")
    p.add_argument("--max-context", type=int, default=3900, help="clip prompts to this many tokens")
    p.add_argument("--token-ids", choices=["derived", "real"], default="derived",
                   help="token ids hashed into blocks: derived from segment keys (fast) or the tokenizer's")
    p.add_argument("--theta-sweep", action="store_true", help="throughput vs Θ with transfers to hide (Fig. 10)")
    p.add_argument("--theta-factors", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1.0, 2.0, 4.0],
                   help="Θ / Θ* values of the sweep")
    p.add_argument("--compare", type=Path, metavar="BENCH.json",
                   help="simulate the CPU benchmark's stream and compare; a live policy matrix (policy_bench --matrix "
                        "JSON) is replayed scenario by scenario and needs --calibration")
    p.add_argument("--matrix", action="store_true",
                   help="the scenario matrix (closed / open 50-80-95%% / bulk; Zipf, uniform, Table-2 mix; KV pools "
                        "bounded and unbounded), every policy side by side; --out also gets a .md table")
    p.add_argument("--matrix-size", choices=["full", "smoke"], default="full",
                   help="full, or smoke: a seconds-long run of every scenario (CI)")
    p.add_argument("--scenarios", default=None, help="comma-separated matrix scenarios (default: all)")
    p.add_argument("--matrix-requests-per-worker", type=int, default=None,
                   help="requests of a matrix scenario per worker (default: the size's)")
    p.add_argument("--matrix-min-requests", type=int, default=None,
                   help="requests of a matrix scenario at least (default: the size's)")
    p.add_argument("--out", type=Path, help="write the results as JSON")
    add_dataclass_args(p, SimConfig, "", "simulation", exclude=("workers", "policy", "cache_aware"))
    add_dataclass_args(p, CacheAwareConfig, "", "sglang-router cache_aware model")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        bench = json.loads(args.compare.read_text()) if args.compare else None
        if isinstance(bench, dict) and "scenarios" in bench and not args.calibration:
            raise ValueError("replaying a live matrix needs --calibration: python -m sgl_moe.simulator.fit_timing's "
                             "JSON of one of its workers")
        cal = load(args.calibration or ("cpu_tiny" if args.compare else "h100_30b"))
        if sum((args.matrix, args.theta_sweep, args.compare is not None)) > 1:
            raise ValueError("choose one of --matrix, --theta-sweep and --compare")
        cache_aware = CacheAwareConfig(**{f.name: getattr(args, f.name) for f in fields(CacheAwareConfig)})
        base = SimConfig(**{f.name: getattr(args, f.name) for f in fields(SimConfig)
                            if f.name not in ("workers", "policy", "cache_aware")}, cache_aware=cache_aware)
        base.validate()
        if any(n < 1 for n in args.workers) or args.requests < 1 or any(
                x is not None and x < 1 for x in (args.matrix_requests_per_worker, args.matrix_min_requests)):
            raise ValueError("--workers, --requests and the matrix sizes must be positive")
        scenarios = select(args.scenarios) if args.matrix else ()
        names = WORKLOADS if args.workloads == "mix" else tuple(args.workloads.split(","))
        stream = WorkloadConfig(workloads=names, requests=args.requests, length_scale=args.length_scale,
                                max_context=args.max_context, seed=args.seed)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    progress = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.time()
    out: dict = {"machine": machine(), "calibration": cal.to_json(), "config": asdict(base),
                 "stream": {"workloads": list(names), "requests": args.requests, "length_scale": args.length_scale,
                            "max_context": args.max_context, "seed": args.seed, "token_ids": args.token_ids}}
    if args.matrix:
        policies = MATRIX_POLICIES if "all" in args.policies else tuple(args.policies)
        sizes = SMOKE if args.matrix_size == "smoke" else FULL
        if args.matrix_requests_per_worker is not None:
            sizes = replace(sizes, requests_per_worker=args.matrix_requests_per_worker)
        if args.matrix_min_requests is not None:
            sizes = replace(sizes, min_requests=args.matrix_min_requests)
        title = (f"Simulated scenario matrix ({cal.name} workers, {sizes.requests_per_worker} requests per worker "
                 f"(at least {sizes.min_requests}), seed {base.seed}; simulator on {out['machine']['cpus']} CPUs)")

        def write(entries: list) -> None:
            out.update(matrix=entries, sizes=asdict(sizes), summary=summary(entries),
                       wall_seconds=time.time() - t0)
            if args.out:
                args.out.write_text(json.dumps(out, indent=2, default=str))
                args.out.with_suffix(".md").write_text(markdown(entries, title))

        entries = run_matrix(cal, base, args.workers, scenarios, policies, sizes, progress, write)
        print(markdown(entries, title))
    elif isinstance(bench, dict) and "scenarios" in bench:
        title = f"Live matrix {args.compare.name} replayed in the simulator"
        try:
            result = live_replay.replay_matrix(bench, cal, base, select_names(args.scenarios), progress)
        except (KeyError, ValueError) as exc:
            print(f"error: {args.compare} is not a policy matrix this replay reads: {exc}", file=sys.stderr)
            return 2
        print(live_replay.markdown(result, title))
        out["replay"] = result
        if args.out:
            args.out.with_suffix(".md").write_text(live_replay.markdown(result, title))
    elif args.compare:
        result = compare_bench(bench, cal, base, progress)
        print(compare_table(result))
        out["compare"] = result
    elif args.theta_sweep:
        workers = args.workers[0] if args.workers != [8, 64, 256] else 8
        rows = theta_sweep(cal, stream, workers, args.theta_factors, base, progress)
        print(sweep_table(rows, cal.hidden_theta(base.transfer), base.transfer, workers))
        out["theta_sweep"] = {"workers": workers, "theta_star_flops": cal.hidden_theta(base.transfer), "rows": rows}
    else:
        policies = POLICIES if "all" in args.policies else tuple(args.policies)
        results = compare_policies(cal, stream, args.workers, policies, base, args.token_ids, progress)
        runs = []
        for n, rs in results.items():
            r0 = rs[0]
            print(table(rs, f"\n{n} workers, {cal.name}, {base.arrival}: {r0.tasks:,} tasks -> {r0.units:,} prefill "
                            f"requests, {r0.prompt_tokens / 1e6:.1f}M prompt tokens, "
                            f"oracle cached {r0.oracle_fraction:.3f}"))
            runs += [r.to_dict() for r in rs]
        out["runs"] = runs
    out["wall_seconds"] = time.time() - t0
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str))
        progress(f"wrote {args.out}")
    return 0


def select_names(names: str | None) -> list[str] | None:
    return [n.strip() for n in names.split(",") if n.strip()] if names else None


if __name__ == "__main__":
    sys.exit(main())
