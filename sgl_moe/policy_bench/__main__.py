"""``python -m sgl_moe.policy_bench``: start workers (or use running ones), then run each policy cold.

``--matrix`` (``--smoke``: tiny, stand-in workers) runs the scenario matrix instead (``policy_bench.matrix``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sgl_moe.harness.router_client import metric
from sgl_moe.harness.worker_process import WorkerProcess, cpu_share, printed_progress
from sgl_moe.policy_bench.bench_model import MODELS, model_args
from sgl_moe.policy_bench.driver import run_stream
from sgl_moe.policy_bench.report import summarize, table, targets
from sgl_moe.policy_bench.routers import OURS, POLICIES, RouterUnderTest, flush_caches, label
from sgl_moe.policy_bench.stream import build_stream, oracle_cached_tokens
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.workloads import WORKLOADS, WorkloadConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.policy_bench", description=__doc__)
    p.add_argument("--workers", type=int, default=3, help="CPU workers to start (default 3)")
    p.add_argument("--model", default="shipped", choices=MODELS,
                   help="the started workers' model: the shipped one or the bench model (default shipped)")
    p.add_argument("--worker-urls", nargs="+", help="use these running workers instead of starting any")
    p.add_argument("--worker-args", default="", help="extra flags for started workers, one string")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--requests", type=int, default=400, help="workload tasks (multi-selection tasks expand)")
    p.add_argument("--workloads", default="mix", help=f"'mix' or comma-separated names from {','.join(WORKLOADS)}")
    p.add_argument("--length-scale", type=float, default=8.0, help="divide Table 2 context lengths by this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight from the client")
    p.add_argument("--out", type=Path, default=Path("policy_bench.json"))
    p.add_argument("--log-dir", type=Path, default=None, help="router and worker logs (default: a temp dir)")
    args = p.parse_args(argv)
    if args.requests <= 0 or args.concurrency <= 0 or args.workers <= 0:
        p.error("--requests, --concurrency and --workers must be positive")
    return args


def start_workers(n: int, log_dir: Path, extra: list[str]) -> list[WorkerProcess]:
    workers = [WorkerProcess(log_path=log_dir / f"worker{i}.log", args=extra, threads=cpu_share(n)).start()
               for i in range(n)]
    t0 = time.time()
    for w in workers:
        w.wait_ready(timeout=900, progress=printed_progress("waiting for workers", sys.stderr))
    print(f"{n} workers ready in {time.time() - t0:.0f} s", file=sys.stderr)
    return workers


def router_stats(router: RouterUnderTest) -> dict[str, float]:
    """This router's own account of the run: holds for promised prefixes, spills, queueing, predictions."""
    out = {}
    for name in ("prefix_waits", "spills", "queued_requests", "queue_pumps", "queue_rescored",
                 "predicted_cached_tokens", "reported_cached_tokens"):
        try:
            out[name] = metric(router.url, name)
        except KeyError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--matrix" in argv or "--smoke" in argv:  # the scenario matrix of issue 18 (see policy_bench.matrix)
        from sgl_moe.policy_bench.matrix import main as matrix_main

        return matrix_main(argv)
    args = parse_args(argv)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="policy_bench-"))
    names = WORKLOADS if args.workloads == "mix" else tuple(args.workloads.split(","))
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        print(f"unknown workloads: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    started: list[WorkerProcess] = []
    try:
        if args.worker_urls:
            urls = args.worker_urls
        else:
            print(f"starting {args.workers} workers of the {args.model} model (logs in {log_dir})", file=sys.stderr)
            started = start_workers(args.workers, log_dir, [*model_args(args.model), *args.worker_args.split()])
            urls = [w.url for w in started]
        info = httpx.get(f"{urls[0]}/sgl_moe/info", timeout=30).json()
        tok = RouterTokenizer.from_files(httpx.get(f"{urls[0]}/sgl_moe/tokenizer.json", timeout=30).content,
                                         httpx.get(f"{urls[0]}/sgl_moe/tokenizer_config.json", timeout=30).json())
        cfg = WorkloadConfig(workloads=names, requests=args.requests, length_scale=args.length_scale, seed=args.seed,
                             max_context=info.get("context_length", 4096) - 200)
        units = build_stream(cfg, tok)
        total = sum(u.prompt_tokens for u in units)
        oracle = oracle_cached_tokens(units, tok, info["page_size"]) / total
        print(f"stream: {args.requests} tasks -> {len(units)} prefill requests, {total} prompt tokens, "
              f"oracle cached fraction {oracle:.3f}", file=sys.stderr)
        rows = []
        for policy in args.policies:
            router = RouterUnderTest(policy, urls, log_dir / f"router-{policy}.log")
            flush_caches(urls)
            router.start()
            flush_caches(urls)  # also drops what a readiness probe may have cached
            print(f"{label(policy)}: running", file=sys.stderr)
            try:
                records, wall = asyncio.run(run_stream(router.url, units, args.concurrency))
                stats = router_stats(router) if policy in OURS else {}
            finally:
                router.stop()
            rows.append(summarize(policy, label(policy), records, wall, args.requests, oracle))
            rows[-1]["router_stats"] = stats
            r = rows[-1]
            print(f"{label(policy)}: {r['throughput_rps']:.2f} req/s, cached {r['cached_fraction']:.3f}, "
                  f"{r['failures']} failures", file=sys.stderr)
        print(table(rows))
        for line in targets(rows):
            print(line)
        result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                              "processor": platform.processor() or platform.machine()},
                  "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "workers": urls, "stream": {"requests": len(units), "tasks": args.requests,
                                               "prompt_tokens": total, "oracle_fraction": oracle},
                  "results": rows, "targets": targets(rows)}
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}", file=sys.stderr)
        return 1 if any(r["failures"] for r in rows) else 0
    finally:
        for w in started:
            w.stop()


if __name__ == "__main__":
    sys.exit(main())
