"""``python -m sgl_moe.policy_bench --matrix``: every scenario of ``scenarios.MATRIX``, every router side by side.

Per scenario: build its seeded stream, then for each router (sgl_moe ``longest_block_match``, sglang-router
``cache_aware``, sgl_moe ``round_robin``) flush the workers' caches, start the router fresh, send it a warm-up
(``WARMUP_REQUESTS`` prompts as long as the stream's first ones, sharing no prefix with it), flush again, offer the
stream (closed loop, open loop or bulk), stop the router. Every router's run thus starts on workers and a router
that have just served requests: the first run after the workers' start-up ran up to 36% slower. ``--repeats N`` runs
every scenario N times, the routers' order rotated each time (none always runs first, or after the same one), and
judges the median of each figure; every run's figures stay in the JSON. Results are written after every scenario
(JSON and a Markdown table) so a cut-short run keeps what it measured. ``--smoke`` runs the same machinery at a tiny
size against stand-in HTTP workers (``standin``): seconds, for CI; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sgl_moe.policy_bench import worker_steps
from sgl_moe.policy_bench.bench_model import MODELS, model_args
from sgl_moe.policy_bench.driver import run_open, run_stream
from sgl_moe.policy_bench.prefix_stream import build_prefix_stream
from sgl_moe.policy_bench.report import matrix_table, median_row, run_ratios, summarize, verdict
from sgl_moe.policy_bench.routers import RouterUnderTest, flush_caches, label
from sgl_moe.policy_bench.scenarios import SMOKE, Scenario, Sizes, select
from sgl_moe.policy_bench.stream import StreamUnit, build_stream, oracle_cached_tokens
from sgl_moe.router.config import SECRET_FIELDS, RouterConfig
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.workloads import WORKLOADS, WorkloadConfig

WARMUP_REQUESTS = 6
"""Unmeasured requests each router serves before its measured run (``warmup_units``)."""

ROUTERS = ("longest_block_match", "cache_aware", "round_robin")
"""sgl_moe's default policy, sglang-router's cache_aware, and round robin (sgl_moe's, with Θ admission)."""



def router_settings(router_args: str) -> dict:
    """The settings sgl_moe's router runs the matrix with (its defaults and ``--router-args``), keys left out:
    what a replay of the matrix needs when the defaults have moved since (``simulator.live_replay``)."""
    cfg = RouterConfig.from_argv(router_args.split())
    return {name: getattr(cfg, name) for name in cfg.__dataclass_fields__
            if name not in SECRET_FIELDS and name != "worker_urls"}

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.policy_bench --matrix", description=__doc__)
    p.add_argument("--matrix", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help="tiny sizes against stand-in HTTP workers (seconds; CI)")
    p.add_argument("--scenarios", default=None, help="comma-separated scenario names (default: all)")
    p.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=ROUTERS)
    p.add_argument("--workers", type=int, default=3, help="workers to start (default 3)")
    p.add_argument("--model", default="shipped", choices=MODELS,
                   help="the started workers' model: the shipped one, or the bench model whose step time grows with "
                        "its tokens as a saturated GPU's does (sgl_moe.policy_bench.bench_model; default shipped)")
    p.add_argument("--worker-urls", nargs="+", help="use these running workers (started with the pool size below)")
    p.add_argument("--pool-tokens", type=int, default=None, help="each worker's KV pool in tokens (default 6144)")
    p.add_argument("--requests", type=int, default=None, help="requests per closed-loop / bulk scenario")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every scenario, routers in rotated order; the median is judged (default 1)")
    p.add_argument("--router-args", default="",
                   help="extra flags for sgl_moe's router, one string given with '=' (--router-args='--prefix-homes')")
    p.add_argument("--out", type=Path, default=Path("policy_matrix.json"))
    p.add_argument("--log-dir", type=Path, default=None)
    args = p.parse_args(argv)
    if args.workers <= 0 or args.repeats <= 0 or (args.requests is not None and args.requests <= 0):
        p.error("--workers, --repeats and --requests must be positive")
    if args.pool_tokens is not None and args.pool_tokens < 512:
        p.error("--pool-tokens must be at least 512")
    try:
        args.selected = select(args.scenarios)
    except ValueError as exc:
        p.error(str(exc))
    sizes = SMOKE if args.smoke else Sizes()
    if args.pool_tokens:
        sizes = Sizes(**{**vars(sizes), "pool_tokens": args.pool_tokens})
    if args.requests:
        sizes = Sizes(**{**vars(sizes), "requests": args.requests})
    args.sizes = sizes
    return args


def stream_for(sc: Scenario, sizes: Sizes, tok: RouterTokenizer, seed: int, context: int,
               requests: int | None = None) -> list[StreamUnit]:
    if sc.stream == "mix":
        cfg = WorkloadConfig(workloads=WORKLOADS, requests=sizes.mix_tasks, length_scale=sizes.mix_length_scale,
                             seed=seed, max_context=min(context - 200, sizes.pool_tokens - 200))
        return build_stream(cfg, tok)
    return build_prefix_stream(sc.prefix_stream(sizes, seed, requests), tok)


def wait_for_theta(urls: list[str], timeout: float = 300.0) -> list[dict]:
    """Every worker's saturation info once none is still calibrating (a profile must not overlap a run)."""
    deadline = time.time() + timeout
    while True:
        infos = [httpx.get(f"{u}/sgl_moe/info", timeout=30).json().get("saturation", {}) for u in urls]
        if all(i.get("state") != "calibrating" for i in infos) or time.time() > deadline:
            return infos
        time.sleep(1.0)


def warmup_units(units: list[StreamUnit], seed: int, n: int = WARMUP_REQUESTS) -> list[StreamUnit]:
    """``n`` prompts as long as the stream's first ones (their words shuffled behind a unique head): they share
    no prefix with the stream or with each other, so the measured run's reuse starts from nothing."""
    rng = random.Random(seed)
    out = []
    for i, u in enumerate(units[:n]):
        words = u.text.split()
        rng.shuffle(words)
        out.append(StreamUnit(f"warmup-{i}", "warmup", f"warm-up {i} {rng.getrandbits(64):x}: " + " ".join(words),
                              u.prompt_tokens))
    return out


def _counters_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The router's cumulative counters over the measured run only (the warm-up's subtracted)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def run_one(sc: Scenario, policy: str, urls: list[str], units: list[StreamUnit], sizes: Sizes, rate: float | None,
            seed: int, log_dir: Path, router_args: list[str], progress: bool, run: int = 1,
            worker_logs: list[Path] | None = None) -> tuple[list, float, dict]:
    """One router's run of the scenario; ``worker_logs`` (workers this process started): their prefill steps
    during the run are read back (``worker_steps``) into the stats."""
    extra = router_args if policy != "cache_aware" else []
    name = f"router-{sc.name}-{policy}" + (f"-run{run}" if run > 1 else "")
    router = RouterUnderTest(policy, urls, log_dir / f"{name}.log", extra_args=extra)
    flush_caches(urls)
    router.start()
    try:
        asyncio.run(run_stream(router.url, warmup_units(units, seed + run), min(4, WARMUP_REQUESTS), progress=False))
        flush_caches(urls)  # the warm-up's prompts (and what a readiness probe may have cached) leave the workers
        mark = worker_steps.LogMark.now(worker_logs) if worker_logs else None
        before = {}
        if policy != "cache_aware":
            from sgl_moe.policy_bench.__main__ import router_stats

            before = router_stats(router)
        cpu0, load0 = router.cpu_seconds(), os.getloadavg()[0]
        if sc.arrival == "open":
            records, wall = asyncio.run(run_open(router.url, units, rate, seed, progress=progress))
        else:
            clients = len(units) if sc.arrival == "bulk" else (
                sizes.mix_clients if sc.stream == "mix" else sizes.clients)
            records, wall = asyncio.run(run_stream(router.url, units, clients, progress=progress))
        cpu1 = router.cpu_seconds()
        stats = {"router_cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
                 "table_sync_s": router.sync_seconds,
                 "loadavg_1m_start": load0, "loadavg_1m_end": os.getloadavg()[0]}
        if policy != "cache_aware":
            stats.update(_counters_since(before, router_stats(router)))
        if mark is not None:
            stats["worker_steps"] = worker_steps.read(worker_logs, mark)
        return records, wall, stats
    finally:
        router.stop()


def write(out: Path, result: dict) -> None:
    out.write_text(json.dumps(result, indent=2))
    md = out.with_suffix(".md")
    m = result["machine"]
    kind = "SMOKE: stand-in workers, figures mean nothing" if result["smoke"] else "real workers"
    md.write_text(
        f"# Policy matrix ({kind})\n\n"
        f"Machine: {m['processor']}, {m['cpus']} CPUs, {m['platform']}; {result['workers']} workers"
        + (f" of the {result['model']} model" if result.get("model") else "") + "; "
        f"KV pool {result['sizes']['pool_tokens']} tokens per worker; seed {result['seed']}"
        + (f"; every scenario run {result['repeats']} times, routers in rotated order, medians shown and judged"
           if result.get("repeats", 1) > 1 else "") + ".\n\n"
        + "\n".join(f"- **{s['name']}**: {s['description']}; {s['stream']['requests']} requests, "
                    f"{s['stream']['prompt_tokens']} prompt tokens, oracle cached fraction "
                    f"{s['stream']['oracle_fraction']:.3f}"
                    + (f", offered {s['offered_rps']:.2f} req/s" if s.get("offered_rps") else "")
                    for s in result["scenarios"])
        + "\n\n" + matrix_table(result["scenarios"]) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes: Sizes = args.sizes
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="policy_matrix-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    started, fleet = [], None
    try:
        if args.smoke:
            from sgl_moe.policy_bench.standin import StandInFleet

            fleet = StandInFleet(args.workers, sizes.pool_tokens).start()
            urls = fleet.urls
        elif args.worker_urls:
            urls = args.worker_urls
        else:
            from sgl_moe.policy_bench.__main__ import start_workers

            print(f"starting {args.workers} workers of the {args.model} model, KV pool {sizes.pool_tokens} tokens "
                  f"(logs in {log_dir})", file=sys.stderr)
            started = start_workers(args.workers, log_dir,
                                    [*model_args(args.model), "--max-total-tokens", str(sizes.pool_tokens)])
            urls = [w.url for w in started]
        thetas = wait_for_theta(urls)
        info = httpx.get(f"{urls[0]}/sgl_moe/info", timeout=30).json()
        tok = RouterTokenizer.from_files(httpx.get(f"{urls[0]}/sgl_moe/tokenizer.json", timeout=30).content,
                                         httpx.get(f"{urls[0]}/sgl_moe/tokenizer_config.json", timeout=30).json())
        result = {"smoke": args.smoke,
                  "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                              "processor": platform.processor() or platform.machine()},
                  "workers": len(urls), "model": None if args.smoke or args.worker_urls else args.model,
                  "sizes": vars(sizes), "seed": args.seed, "router_args": args.router_args,
                  "router_config": router_settings(args.router_args), "repeats": args.repeats,
                  "worker_theta": thetas, "scenarios": []}
        best_rps: dict[str, float] = {}
        t_start = time.time()
        for sc in args.selected:
            rate, n = None, None
            if sc.arrival == "open":
                capacity = best_rps.get(sc.capacity_from)
                if capacity is None:
                    print(f"{sc.name}: skipped (its capacity scenario {sc.capacity_from} did not run)", file=sys.stderr)
                    continue
                rate = sc.load * capacity
                n = max(4, int(rate * sizes.open_seconds))
            units = stream_for(sc, sizes, tok, args.seed, int(info.get("context_length") or 4096), n)
            total = sum(u.prompt_tokens for u in units)
            oracle = oracle_cached_tokens(units, tok, int(info["page_size"])) / total
            print(f"== {sc.name}: {sc.describe()}; {len(units)} requests, {total} prompt tokens, oracle {oracle:.3f}"
                  + (f", offered {rate:.2f} req/s" if rate else ""), file=sys.stderr)
            runs: dict[str, list[dict]] = {policy: [] for policy in args.routers}
            for rep in range(args.repeats):
                k = rep % len(args.routers)
                for policy in args.routers[k:] + args.routers[:k]:
                    records, wall, stats = run_one(sc, policy, urls, units, sizes, rate, args.seed, log_dir,
                                                   args.router_args.split(), progress=not args.smoke, run=rep + 1,
                                                   worker_logs=[w.log_path for w in started])
                    row = summarize(policy, label(policy), records, wall, len(units), oracle)
                    row["router_stats"] = stats
                    runs[policy].append(row)
                    print(f"  {row['router']}{f' (run {rep + 1})' if args.repeats > 1 else ''}: "
                          f"{row['throughput_rps']:.2f} req/s, cached {row['cached_fraction']:.3f}, "
                          f"p99 {row['latency_p99_ms']:.0f} ms, {row['failures']} failures", file=sys.stderr)
            rows = [median_row(runs[policy]) for policy in args.routers]
            if sc.arrival == "bulk":
                best_rps[sc.name] = max(r["throughput_rps"] for r in rows)
            entry = {"name": sc.name, "description": sc.describe(), "arrival": sc.arrival, "pool": sc.pool,
                     "popularity": sc.stream, "offered_rps": rate,
                     "stream": {"requests": len(units), "prompt_tokens": total, "oracle_fraction": oracle},
                     "results": rows, "verdict": {**verdict(rows, sc.arrival),
                                                  "runs_rps_vs_cache_aware": run_ratios(rows)}}
            result["scenarios"].append(entry)
            result["elapsed_s"] = time.time() - t_start
            write(args.out, result)
        print(matrix_table(result["scenarios"]))
        print(f"wrote {args.out} and {args.out.with_suffix('.md')} ({result.get('elapsed_s', 0):.0f} s)",
              file=sys.stderr)
        return 1 if any(r["failures"] for s in result["scenarios"] for r in s["results"]) else 0
    finally:
        for w in started:
            w.stop()
        if fleet is not None:
            fleet.stop()
