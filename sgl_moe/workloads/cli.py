"""``python -m sgl_moe.workloads``: contract-A tasks as JSON lines, and a summary on stderr.

    python -m sgl_moe.workloads --requests 2000 --workloads quality,arxiv --length-scale 8 --seed 0 \\
        --out tasks.jsonl

The summary gives, per workload and in all: requests, prompt tokens (mean/min/max/total), prefill
tokens (every unit: prompt plus choice listing, or one sibling per candidate) and the oracle cached
fraction (``oracle``: one worker, unbounded radix cache, units in file order).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import IO

import orjson

from sgl_moe.cli_args import add_dataclass_args, from_namespace
from sgl_moe.workloads.config import PAGE, WORKLOADS, WorkloadConfig
from sgl_moe.workloads.mix import generate
from sgl_moe.workloads.oracle import OracleCache
from sgl_moe.workloads.request import prompt_tokens, to_task, unit_segments


@dataclass
class WorkloadStats:
    requests: int = 0
    prompt_min: int | None = None
    prompt_max: int = 0
    prompt_total: int = 0
    prefill_total: int = 0
    cached: int = 0
    groups: set[str] = field(default_factory=set)

    def add(self, prompt: int, prefill: int, cached: int, group: str) -> None:
        self.requests += 1
        self.prompt_min = prompt if self.prompt_min is None else min(self.prompt_min, prompt)
        self.prompt_max = max(self.prompt_max, prompt)
        self.prompt_total += prompt
        self.prefill_total += prefill
        self.cached += cached
        self.groups.add(group)

    def row(self, name: str) -> str:
        mean = self.prompt_total / self.requests if self.requests else 0.0
        frac = self.cached / self.prefill_total if self.prefill_total else 0.0
        return (f"{name:<9}{self.requests:>9}{len(self.groups):>8}{mean:>9.1f}{self.prompt_min or 0:>7}"
                f"{self.prompt_max:>7}{self.prompt_total:>12}{self.prefill_total:>12}{frac:>9.3f}")


HEADER = (f"{'workload':<9}{'requests':>9}{'groups':>8}{'mean':>9}{'min':>7}{'max':>7}{'prompt_tok':>12}"
          f"{'prefill_tok':>12}{'oracle':>9}")


def write_tasks(cfg: WorkloadConfig, out: IO[bytes] | None) -> dict[str, WorkloadStats]:
    """Write every task to ``out`` (``None``: statistics only) and return per-workload statistics."""
    stats = {w: WorkloadStats() for w in cfg.workloads}
    cache = OracleCache(PAGE)
    for req in generate(cfg):
        units = unit_segments(req)
        cached = sum(cache.prefill(u) for u in units)
        prefill = sum(s.tokens for u in units for s in u)
        stats[req.workload].add(prompt_tokens(req), prefill, cached, req.group)
        if out is not None:
            out.write(orjson.dumps(to_task(req)) + b"\n")
    return stats


def summary(stats: dict[str, WorkloadStats]) -> str:
    everything = WorkloadStats()
    for s in stats.values():
        if s.requests:
            everything.requests += s.requests
            everything.prompt_min = s.prompt_min if everything.prompt_min is None else min(
                everything.prompt_min, s.prompt_min or 0)
            everything.prompt_max = max(everything.prompt_max, s.prompt_max)
            everything.prompt_total += s.prompt_total
            everything.prefill_total += s.prefill_total
            everything.cached += s.cached
            everything.groups |= s.groups
    return "\n".join([HEADER, *(s.row(w) for w, s in stats.items()), everything.row("all")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_moe.workloads", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all six, the mix)")
    parser.add_argument("--out", default="-", help="output file of JSON lines (default: - for stdout)")
    parser.add_argument("--no-tasks", action="store_true", help="print the summary only (renders no text)")
    add_dataclass_args(parser, WorkloadConfig, prefix="", title="workload", exclude=("workloads",))
    args = parser.parse_args(argv)
    try:
        cfg = from_namespace(WorkloadConfig, args, "", workloads=args.workloads)
    except ValueError as e:
        parser.error(str(e))
    start = time.perf_counter()
    if args.no_tasks:
        stats = write_tasks(cfg, None)
    elif args.out == "-":
        stats = write_tasks(cfg, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        with open(args.out, "wb") as f:
            stats = write_tasks(cfg, f)
    elapsed = time.perf_counter() - start
    print(summary(stats), file=sys.stderr)
    print(f"{cfg.requests} requests (seed {cfg.seed}, length scale {cfg.length_scale:g}, "
          f"max context {cfg.max_context}) in {elapsed:.2f} s"
          + ("" if args.no_tasks or args.out == "-" else f" -> {args.out}"), file=sys.stderr)
    return 0
