"""Worker front CPU: what a real SGLang worker's front spends per request on text, as sglang-router forwards it,
against token ids, as sgl_moe's router sends them.

    .venv/bin/python benchmarks/worker_front_cpu.py [--prompt-tokens 200 2000] [--shapes shared unique]
        [--requests 300] [--warmup 40] [--concurrency 8] [--repeats 2] [--out FILE.json]

Smallest run (what CI runs, on the test session's worker): ``--prompt-tokens 200 --shapes shared --requests 20
--warmup 4 --repeats 1 --worker-url URL --worker-pid PID``.

``router_capacity.py`` measures routers in front of stand-ins that do not tokenize, so it leaves out the other side
of one trade: sglang-router forwards the prompt's text, and the worker's front (SGLang's HTTP server and its
``TokenizerManager``, one process: the worker's main process) tokenizes it; sgl_moe's router sends the ids it
computed for placement, and the front skips its tokenizer. This script sends the same streams (``router_capacity``'s
``build_stream``: 40 Zipf-popular shared instruction blocks and a unique tail, or unique prompts) straight to one
real worker (``python -m sgl_moe.launch_server`` on the shipped model, CPU), once as ``{"text": ...}`` and once as
``{"input_ids": ...}`` (ids from ``transformers.AutoTokenizer`` on the model's own files, which is what the front
would have computed), ``max_new_tokens`` 1, and reads the CPU time (user + system) of

* the **front**: the worker's main process (HTTP, JSON, tokenizer, its side of the scheduler's sockets), and
* the **engine**: its child processes (the scheduler, which runs the model, and the detokenizer),

over each measured window, per request. The front spends some CPU with nothing to do (SGLang's threads wake
on timers); ``--idle-s`` seconds with no request measure that rate first, and **front less idle** subtracts it over
each window's wall time (both forms run about as long, so their difference hardly moves). Each (stream, form,
repeat) gets its own slice of the stream, so no window meets tails another already cached; the forms' order
reverses every other repeat. The answers' ``prompt_tokens`` must equal the number of ids sent (text and ids
alike): a form that prefilled another count is flagged.

``--worker-url URL --worker-pid PID`` measure a running worker (its main process's pid) instead of starting one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_capacity import SHAPES, Filler, build_stream  # noqa: E402

from sgl_moe import DEFAULT_MODEL_DIR  # noqa: E402
from sgl_moe.policy_bench.driver import run_stream  # noqa: E402
from sgl_moe.policy_bench.stream import StreamUnit  # noqa: E402

FORMS = ("text", "ids")
MAX_PROMPT_TOKENS = 4000
"""The shipped model's context is 4,096 tokens."""


@dataclass(frozen=True)
class IdsUnit:
    """A stream unit sent as the token ids its text encodes to (what sgl_moe's router sends a worker)."""

    task_id: str
    workload: str
    input_ids: list[int]

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)

    def body(self) -> dict:
        return {"input_ids": self.input_ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}


class WorkerCpu:
    """CPU seconds (user + system) of a worker's main process and, apart, of its children."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self._children: dict[int, tuple[psutil.Process, float]] = {}
        """pid -> (process, its CPU seconds when last read): a child that exits keeps its last reading."""

    def read(self) -> tuple[float, float]:
        t = self.root.cpu_times()
        for child in self.root.children(recursive=True):
            self._children.setdefault(child.pid, (child, 0.0))
        for pid, (child, _) in self._children.items():
            try:
                c = child.cpu_times()
            except psutil.NoSuchProcess:
                continue
            self._children[pid] = (child, c.user + c.system)
        return t.user + t.system, sum(last for _, last in self._children.values())


def stream_slices(stream, parts: int) -> list[list[StreamUnit]]:
    n = len(stream.measured) // parts
    return [stream.measured[i * n:(i + 1) * n] for i in range(parts)]


def ids_units(units: list[StreamUnit], tokenizer) -> list[IdsUnit]:
    encoded = tokenizer([u.text for u in units])["input_ids"]
    return [IdsUnit(u.task_id, u.workload, list(ids)) for u, ids in zip(units, encoded)]


async def idle_rate(cpu: WorkerCpu, seconds: float) -> float:
    """The front's CPU seconds per second with no request in flight."""
    f0, _ = cpu.read()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    f1, _ = cpu.read()
    return (f1 - f0) / (time.perf_counter() - t0)


async def measure(url: str, units, concurrency: int, cpu: WorkerCpu, idle: float) -> dict:
    f0, e0 = cpu.read()
    records, wall = await run_stream(url, units, concurrency, progress=False)
    f1, e1 = cpu.read()
    n = len(records)
    bad = [r for r in records if r.status != 200]
    wrong = [(u.prompt_tokens, r.prompt_tokens) for u, r in zip(units, records)
             if r.status == 200 and r.prompt_tokens != u.prompt_tokens]
    return {"requests": n, "errors": len(bad), "first_error": f"{bad[0].status}: {bad[0].error}"[:300] if bad else None,
            "prompt_tokens_differ": len(wrong), "first_difference": wrong[0] if wrong else None,
            "wall_s": wall, "req_per_s": n / wall if wall > 0 else 0.0,
            "front_cpu_ms_per_request": (f1 - f0) / n * 1e3, "engine_cpu_ms_per_request": (e1 - e0) / n * 1e3,
            "front_less_idle_ms_per_request": (f1 - f0 - idle * wall) / n * 1e3,
            "tokens_mean": sum(u.prompt_tokens for u in units) / n}


def pool(runs: list[dict]) -> dict:
    n = sum(r["requests"] for r in runs)
    out = {"requests": n, "repeats": len(runs), "errors": sum(r["errors"] for r in runs),
           "prompt_tokens_differ": sum(r["prompt_tokens_differ"] for r in runs),
           "first_error": next((r["first_error"] for r in runs if r["first_error"]), None),
           "first_difference": next((r["first_difference"] for r in runs if r["first_difference"]), None)}
    for key in ("front_cpu_ms_per_request", "engine_cpu_ms_per_request", "front_less_idle_ms_per_request"):
        out[key] = sum(r[key] * r["requests"] for r in runs) / n
        out[key.replace("_ms_per_request", "_ms_repeats")] = [r[key] for r in runs]
    out["req_per_s"] = n / sum(r["wall_s"] for r in runs)
    out["tokens_mean"] = sum(r["tokens_mean"] * r["requests"] for r in runs) / n
    return out


def table(rows: list[dict]) -> str:
    lines = ["| stream | form | front CPU ms/req (repeats) | front less idle | engine CPU ms/req | req/s "
             "| prompt tokens | flagged |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        reps = ", ".join(f"{x:.3f}" for x in r["front_cpu_ms_repeats"])
        flagged = []
        if r["errors"]:
            flagged.append(f"{r['errors']} errors ({r['first_error']})")
        if r["prompt_tokens_differ"]:
            flagged.append(f"{r['prompt_tokens_differ']} prefilled another count (sent, answered: "
                           f"{r['first_difference']})")
        lines.append(f"| {r['stream']} | {r['form']} | {r['front_cpu_ms_per_request']:.3f} ({reps}) | "
                     f"{r['front_less_idle_ms_per_request']:.3f} | "
                     f"{r['engine_cpu_ms_per_request']:.2f} | {r['req_per_s']:.1f} | {r['tokens_mean']:.0f} | "
                     f"{'; '.join(flagged) or 'no'} |")
    return "\n".join(lines)


def savings(rows: list[dict]) -> dict[str, float]:
    """Per stream: the front's CPU per request on text less on ids (what tokenizing in the router spares it)."""
    by = {(r["stream"], r["form"]): r for r in rows}
    return {s: by[(s, "text")]["front_cpu_ms_per_request"] - by[(s, "ids")]["front_cpu_ms_per_request"]
            for s, f in by if f == "text" and (s, "ids") in by}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", nargs="+", type=int, default=[200, 2000])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--requests", type=int, default=300, help="measured requests per (stream, form, repeat)")
    parser.add_argument("--warmup", type=int, default=40, help="requests of each stream sent first as text, not "
                                                                "measured (the shared prefixes reach the cache)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (closed loop)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of both forms, their order reversed every other")
    parser.add_argument("--threads", type=int, default=1,
                        help="the started worker's compute threads (OMP_NUM_THREADS): 1 leaves the front a core of "
                             "its own on a 2-core machine, as a GPU worker's scheduler leaves its host's cores free")
    parser.add_argument("--worker-url", help="measure this running worker instead of starting one (needs --worker-pid)")
    parser.add_argument("--worker-pid", type=int, help="the running worker's main process")
    parser.add_argument("--idle-s", type=float, default=10.0,
                        help="seconds with no request first, to measure the front's idle CPU rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write every figure as JSON")
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.idle_s < 0:
        parser.error(f"--idle-s must be 0 or more, got {args.idle_s}")
    for n in args.prompt_tokens:
        if not 20 <= n <= MAX_PROMPT_TOKENS:
            parser.error(f"--prompt-tokens must be between 20 and {MAX_PROMPT_TOKENS} (the shipped model's "
                         f"context is 4,096), got {n}")
    if (args.worker_url is None) != (args.worker_pid is None):
        parser.error("--worker-url and --worker-pid go together")
    if args.worker_pid is not None:
        if not psutil.pid_exists(args.worker_pid):
            parser.error(f"--worker-pid {args.worker_pid}: no such process")
    args.prompt_tokens = list(dict.fromkeys(args.prompt_tokens))
    return args


async def run_all(args, url: str, cpu: WorkerCpu, tokenizer) -> tuple[float, list[dict]]:
    idle = await idle_rate(cpu, args.idle_s) if args.idle_s > 0 else 0.0
    print(f"front idle: {idle * 1e3:.2f} ms CPU per second", file=sys.stderr, flush=True)
    filler = Filler()
    parts = 2 * args.repeats
    rows = []
    for tokens in args.prompt_tokens:
        for shape in args.shapes:
            stream = build_stream(filler, shape, tokens, args.warmup, args.requests * parts, args.seed)
            if stream.warmup:
                await run_stream(url, stream.warmup, args.concurrency, progress=False)
            slices = stream_slices(stream, parts)
            runs: dict[str, list[dict]] = {f: [] for f in FORMS}
            for rep in range(args.repeats):
                order = FORMS if rep % 2 == 0 else FORMS[::-1]
                for k, form in enumerate(order):
                    units = slices[2 * rep + k]
                    sent = units if form == "text" else ids_units(units, tokenizer)
                    r = await measure(url, sent, args.concurrency, cpu, idle)
                    runs[form].append(r)
                    print(f"[{stream.name} {form} {rep + 1}/{args.repeats}] front "
                          f"{r['front_cpu_ms_per_request']:.3f} ms/req, engine {r['engine_cpu_ms_per_request']:.2f}"
                          f" ms/req, {r['req_per_s']:.1f} req/s, {r['errors']} errors, "
                          f"{r['prompt_tokens_differ']} prompt-token differences", file=sys.stderr, flush=True)
            rows += [{"stream": stream.name, "form": f, **pool(runs[f])} for f in FORMS]
    return idle, rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_DIR))
    worker = None
    if args.worker_url is None:
        from sgl_moe.harness.worker_process import WorkerProcess, WorkerStartError, printed_progress

        log = Path(tempfile.mkdtemp(prefix="worker-front-cpu-")) / "worker.log"
        worker = WorkerProcess(log_path=log, args=["--no-moe-theta-profile"], threads=args.threads).start()
        try:
            worker.wait_ready(timeout=600, progress=printed_progress("waiting for the worker", sys.stderr))
        except WorkerStartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        url, pid = worker.url, worker.proc.pid
    else:
        url, pid = args.worker_url.rstrip("/"), args.worker_pid
    try:
        t0 = time.time()
        idle, rows = asyncio.run(run_all(args, url, WorkerCpu(pid), tokenizer))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if worker is not None:
            worker.stop()
    saved = savings(rows)
    print(table(rows))
    print("front CPU the ids spare the worker per request: "
          + ", ".join(f"{s} {ms:.3f} ms" for s, ms in saved.items()))
    if args.out is not None:
        args.out.write_text(json.dumps({
            "command": "benchmarks/worker_front_cpu.py " + shlex.join(sys.argv[1:] if argv is None else argv),
            "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()},
            "config": {k: v for k, v in vars(args).items() if k != "out"},
            "wall_s": time.time() - t0, "front_idle_cpu_ms_per_s": idle * 1e3, "rows": rows,
            "front_cpu_saved_ms_per_request": saved}, indent=2) + "\n")
    flagged = [r for r in rows if r["errors"] or r["prompt_tokens_differ"]]
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
