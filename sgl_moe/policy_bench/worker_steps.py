"""The prefill steps a live SGLang worker ran, read from its log: what the simulator's engines are checked against.

SGLang logs one line per prefill batch (``Prefill batch, #new-seq: …, #new-token: …, #cached-token: …, token
usage: …, #running-req: …, #queue-req: …``). ``LogMark`` notes where each worker's log ends before a measured run;
``steps_since`` reads the batches logged after it, and ``summary`` reduces them to the figures the simulator also
reports: steps, requests and new tokens per step, and how many steps were admitted while the previous step's
requests were still running (SGLang's overlap scheduler processes a step's results after admitting the next).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFILL = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), "
                     r"token usage: [0-9.]+, #running-req: (\d+), #queue-req: (\d+)")


@dataclass(frozen=True)
class Step:
    requests: int
    new_tokens: int
    cached_tokens: int
    running: int
    """Requests still running when this step was admitted."""
    queued: int


@dataclass(frozen=True)
class LogMark:
    """Where each worker's log ended at one moment (byte offsets)."""

    offsets: tuple[int, ...]

    @classmethod
    def now(cls, logs: list[Path]) -> LogMark:
        return cls(tuple(p.stat().st_size if p.exists() else 0 for p in logs))


def steps_since(log: Path, offset: int) -> list[Step]:
    """The prefill steps ``log`` recorded after byte ``offset``."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [Step(*(int(g) for g in m.groups())) for m in PREFILL.finditer(text)]


def summary(per_worker: list[list[Step]]) -> dict[str, Any]:
    steps = [s for worker in per_worker for s in worker]
    n = len(steps)
    after_running = sum(1 for worker in per_worker for prev, s in zip(worker, worker[1:])
                        if s.running and s.running == prev.requests)
    return {"steps": n, "steps_per_worker": [len(w) for w in per_worker],
            "requests": sum(s.requests for s in steps),
            "requests_per_step": sum(s.requests for s in steps) / n if n else None,
            "new_tokens_per_step": sum(s.new_tokens for s in steps) / n if n else None,
            "cached_tokens": sum(s.cached_tokens for s in steps),
            "new_tokens": sum(s.new_tokens for s in steps),
            "steps_admitted_with_previous_running": after_running,
            "max_queued": max((s.queued for s in steps), default=0)}


def read(logs: list[Path], mark: LogMark) -> dict[str, Any]:
    """``summary`` of the steps every worker logged since ``mark``."""
    return summary([steps_since(p, o) for p, o in zip(logs, mark.offsets)])
