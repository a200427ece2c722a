"""What the scheduler places and what placing it produces: a ``Job`` (one request) and its ``Placement``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.pending import Promise

_NOW = object()
"""``Job``'s default ``arrived``: the clock when it is made."""


@dataclass(eq=False, slots=True, init=False)
class Job:
    """One unit of placement: a request (all its prompts go to one worker)."""

    rid: str
    prompt_lens: list[int]
    keys: list[Sequence[int]]
    """Block hashes of each prompt (one sequence per prompt, empty for a prompt shorter than a page: the router's
    are ``PackedHashes``, a list of ints does the same); none at all (``[]``) when the request is routed without
    affinity: it is then placed by load alone."""
    shared_prefix_len: int = 0
    max_new_tokens: int = 1
    exclude: frozenset[str] = frozenset()
    """Workers not to use (one that already failed this request)."""
    arrived: float = field(default_factory=time.monotonic)
    future: asyncio.Future | None = None
    """While the job waits in the admission queue: what wakes its ``acquire`` (answered with the placement, which
    refers back to the job: ``acquire`` lets go of it once answered, so the request's objects are freed as soon as
    it ends rather than left for the cyclic garbage collector)."""
    queued: bool = False
    """Waited in the admission queue (``Scheduler.acquire``), on this try or an earlier one."""
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

    def __init__(self, rid: str, prompt_lens: list[int], keys: list[Sequence[int]], shared_prefix_len: int = 0,
                 max_new_tokens: int = 1, exclude: frozenset[str] = frozenset(), arrived: float = _NOW,  # type: ignore[assignment]
                 future: asyncio.Future | None = None, queued: bool = False, waiting_for: str | None = None,
                 waiting_cost: float = 0.0, held: bool = False, wait_started: float | None = None,
                 wait_limit_s: float | None = None) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.rid = rid
        self.prompt_lens = prompt_lens
        self.keys = keys
        self.shared_prefix_len = shared_prefix_len
        self.max_new_tokens = max_new_tokens
        self.exclude = exclude
        self.arrived = time.monotonic() if arrived is _NOW else arrived
        self.future = future
        self.queued = queued
        self.waiting_for = waiting_for
        self.waiting_cost = waiting_cost
        self.held = held
        self.wait_started = wait_started
        self.wait_limit_s = wait_limit_s

    @property
    def affinity(self) -> bool:
        """Whether the job is placed by the prefix its workers hold (else by load alone)."""
        return bool(self.keys)


@dataclass(eq=False, slots=True, init=False)
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

    def __init__(self, job: Job, worker: Worker, slot: int, dp_rank: int, cost: float, predicted_cached_tokens: int,
                 matched_blocks: int, reason: str, queued_s: float, decision_s: float, promise: Promise | None = None,
                 released: bool = False, settle: Callable[[bool], None] | None = None) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.job = job
        self.worker = worker
        self.slot = slot
        self.dp_rank = dp_rank
        self.cost = cost
        self.predicted_cached_tokens = predicted_cached_tokens
        self.matched_blocks = matched_blocks
        self.reason = reason
        self.queued_s = queued_s
        self.decision_s = decision_s
        self.promise = promise
        self.released = released
        self.settle = settle
