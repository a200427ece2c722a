"""What the scheduler places and what placing it produces: a ``Job`` (one request) and its ``Placement``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.pending import Promise


@dataclass(eq=False, slots=True)
class Job:
    """One unit of placement: a request (all its prompts go to one worker)."""

    rid: str
    prompt_lens: list[int]
    keys: list[list[int]]
    """Block hashes of each prompt (one list per prompt, empty for a prompt shorter than a page); no lists
    at all (``[]``) when the request is routed without affinity: it is then placed by load alone."""
    shared_prefix_len: int = 0
    max_new_tokens: int = 1
    exclude: frozenset[str] = frozenset()
    """Workers not to use (one that already failed this request)."""
    arrived: float = field(default_factory=time.monotonic)
    future: asyncio.Future | None = None
    waiting_for: str | None = None
    """The saturated worker this queued job chose to wait for, and its cost there."""
    waiting_cost: float = 0.0
    held: bool = False
    """Waited (or waits) for promised prefix blocks to be stored (see ``Scheduler``'s prefix wait)."""
    wait_started: float | None = None
    """When this job first chose to wait for its saturated best-matching worker (the clock of
    ``max_affinity_wait_s``: counted from when the wait starts, not from arrival, so that a job that sat in a
    deep backlog is not "late" the moment it first comes up)."""
    wait_limit_s: float | None = None
    """How long that wait may last before the job spills by time alone, fixed when the wait starts
    (``PlacementPolicy.wait_limit``)."""

    @property
    def affinity(self) -> bool:
        """Whether the job is placed by the prefix its workers hold (else by load alone)."""
        return bool(self.keys)


@dataclass(eq=False, slots=True)
class Placement:
    """A job given to a worker, with its reservation (``cost`` in-flight FLOPs) made until ``release``."""

    job: Job
    worker: Worker
    slot: int
    dp_rank: int
    cost: float
    predicted_cached_tokens: int
    matched_blocks: int
    reason: str
    queued_s: float
    decision_s: float
    promise: Promise | None = None
    released: bool = False
    settle: Callable[[bool], None] | None = None
    """Set when another router replica made this placement (``replicas.shared_placement``): releasing it tells
    that replica (``ok``) instead of this router's scheduler, which reserved nothing."""
