"""``python -m sgl_moe.classify FILE --router URL``: classify a JSON-lines file of tasks through the router.

Exit status: 0 when every line of FILE has a successful result, 1 otherwise (failures, an interrupted
run, an unreachable router), 2 for usage errors (bad flags, missing FILE, malformed URL).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import aiohttp

from sgl_moe.classify.client import ClassifyConfig, ClassifyRun
from sgl_moe.cli_args import add_dataclass_args, from_namespace

USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sgl_moe.classify",
        description="Send a JSON-lines file of /v1/classify tasks (contract A, one per line) to the router in "
                    "batches; write one result per line to a results file as answers arrive. Rerunning the same "
                    "command resumes: lines already answered successfully are skipped.")
    parser.add_argument("file", type=Path, metavar="FILE", help="input: one task object per line")
    add_dataclass_args(parser, ClassifyConfig, prefix="", title="client")
    return parser


def default_out(path: Path) -> Path:
    """``tasks.jsonl`` -> ``tasks.results.jsonl``."""
    return path.with_suffix(".results.jsonl")


async def _reachable(url: str) -> str | None:
    """None if the router answers HTTP at all (even 503: it may be waiting for workers), else why not."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.get(f"{url.rstrip('/')}/health") as resp:
                await resp.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def _run(run: ClassifyRun) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if not stop.is_set():
            sys.stderr.write("\nclassify: interrupted; stopping (answers written so far are kept)\n")
        stop.set()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (ValueError, RuntimeError, NotImplementedError):
            pass  # not the main thread: the caller handles interruption
    try:
        await run.run(stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = from_namespace(ClassifyConfig, args, "")
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    path: Path = args.file
    if not path.is_file():
        print(f"error: input file {str(path)!r} does not exist or is not a file", file=sys.stderr)
        return USAGE_ERROR
    out = Path(cfg.out) if cfg.out else default_out(path)
    if out.resolve() == path.resolve():
        print("error: --out must differ from the input file", file=sys.stderr)
        return USAGE_ERROR
    if not out.parent.is_dir():
        print(f"error: the folder of --out {str(out)!r} does not exist", file=sys.stderr)
        return USAGE_ERROR
    why = asyncio.run(_reachable(cfg.router))
    if why is not None:
        print(f"error: cannot reach the router at {cfg.router}: {why}", file=sys.stderr)
        return 1
    run = ClassifyRun(cfg, path, out, sys.stderr, tty=sys.stderr.isatty())
    asyncio.run(_run(run))
    run.progress.finish(str(out), run.interrupted)
    if run.stale:
        print(f"classify: {run.stale} results had another id than their input line (the input changed); "
              "those lines were sent again", file=sys.stderr)
    if run.skipped_failed:
        print(f"classify: {run.skipped_failed} lines skipped with an earlier error (--no-retry-failed)",
              file=sys.stderr)
    return 0 if run.all_ok else 1
