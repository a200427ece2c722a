"""SGLang's own ``bench_serving`` through each router, side by side, against the same running workers.

    .venv/bin/python benchmarks/bench_serving_routers.py --worker-urls URL [URL ...] [--repeats 2] [--out F.json]

Smallest run (what CI runs): ``--repeats 1 --routers longest_block_match cache_aware --groups 2
--prompts-per-group 2 --system-len 32 --question-len 8 --concurrency 4``; about a minute on 2 cores, most of it
the two ``sglang.bench_serving`` interpreters importing sglang (~18 s each).

A workload nobody here wrote: ``generated-shared-prefix`` (Zipf-popular system-prompt groups, one output token:
prefill-only), all requests offered at once with ``--max-concurrency`` in flight. Before each router the workers'
caches are flushed and the router is started fresh; the routers' order rotates between repeats. Reports
bench_serving's own figures per run and the router process's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import httpx

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.policy_bench.routers import POLICIES, RouterUnderTest, flush_caches, label

ROUTERS = ["longest_block_match", "cache_aware", "round_robin"]
FIELDS = ("completed", "request_throughput", "input_throughput", "mean_e2e_latency_ms", "p99_e2e_latency_ms",
          "duration")


def bench_args(args: argparse.Namespace, url: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
            "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(args.groups),
            "--gsp-prompts-per-group", str(args.prompts_per_group), "--gsp-system-prompt-len", str(args.system_len),
            "--gsp-question-len", str(args.question_len), "--gsp-output-len", "1",
            "--gsp-group-distribution", "zipf", "--gsp-zipf-alpha", str(args.zipf_alpha),
            "--num-prompts", str(args.groups * args.prompts_per_group), "--request-rate", "inf",
            "--max-concurrency", str(args.concurrency), "--tokenizer", str(DEFAULT_MODEL_DIR),
            "--model", str(DEFAULT_MODEL_DIR), "--output-file", str(out), "--seed", str(args.seed),
            "--disable-tqdm"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker-urls", nargs="+", required=True)
    p.add_argument("--routers", nargs="+", default=ROUTERS, choices=POLICIES)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--groups", type=int, default=48)
    p.add_argument("--prompts-per-group", type=int, default=12)
    p.add_argument("--system-len", type=int, default=256)
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--zipf-alpha", type=float, default=1.1)
    p.add_argument("--concurrency", type=int, default=48)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-dir", type=Path, default=Path(".work/logs/bench-serving"))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if min(args.repeats, args.groups, args.prompts_per_group, args.system_len, args.question_len,
           args.concurrency) < 1:
        p.error("--repeats, --groups, --prompts-per-group, --system-len, --question-len and --concurrency must be "
                "positive")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {}
    for rep in range(args.repeats):
        order = args.routers[rep % len(args.routers):] + args.routers[:rep % len(args.routers)]
        for policy in order:
            try:
                flush_caches(args.worker_urls)
            except (httpx.RequestError, RuntimeError) as exc:  # a worker not up, or busy: one line
                url = exc.request.url if isinstance(exc, httpx.RequestError) else ""
                print(f"bench_serving_routers: cannot flush the workers' caches: {url} {exc}", file=sys.stderr)
                return 1
            router = RouterUnderTest(policy, args.worker_urls, args.log_dir / f"router-{policy}-{rep}.log")
            out = args.log_dir / f"{policy}-{rep}.jsonl"
            out.unlink(missing_ok=True)
            try:
                router.start(120)
                cpu0 = router.cpu_seconds()
                proc = subprocess.run(bench_args(args, router.url, out), capture_output=True, text=True, timeout=1800)
                cpu1 = router.cpu_seconds()
            finally:
                router.stop()
            if proc.returncode != 0:
                print(f"{label(policy)}: bench_serving failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                return 1
            res = json.loads(out.read_text().strip().splitlines()[-1])
            row = {k: res.get(k) for k in FIELDS}
            row["router_cpu_s"] = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
            results.setdefault(label(policy), []).append(row)
            print(f"run {rep + 1}: {label(policy):<30} {row['request_throughput']:7.2f} req/s  p99 "
                  f"{row['p99_e2e_latency_ms']:7.0f} ms  {row['completed']} completed  router CPU "
                  f"{row['router_cpu_s']} s", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
