"""What the simulator's memo (``memo``) keeps per queued job: why its last scoring still holds.

``Certificate``: the facts a ``longest_block_match`` job's "still waiting" answer depended on; an event
that touches any of them makes it dirty, which puts the job back among those the next pump scores.
``QueueLog``: the scheduler's queue, numbering jobs as they are appended (queue order = number order).
``RunningSums``: the queued waiting cost ahead per worker during one pump (``Scheduler.pump``'s sums).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from sgl_moe.router.job import Job
from sgl_moe.router.load_order import LoadOrder
from sgl_moe.router.scheduler import PUMP_SCAN_LIMIT


class DirtySink(Protocol):
    """Who learns that a certificate broke (the memo scheduler)."""

    def mark_dirty(self, job: Job) -> None: ...


class Certificate:
    """Why a queued job's last scoring still holds (see the module docstring)."""

    __slots__ = ("job", "view", "waits_for", "ahead", "expires", "threshold", "clean", "owner", "deferred")

    def __init__(self, owner: DirtySink, job: Job, view: LoadOrder, waits_for: str, ahead: float | None,
                 expires: float, threshold: float | None, deferred: bool = False) -> None:
        self.owner = owner
        self.job = job
        self.view = view
        self.waits_for = waits_for
        self.ahead = ahead
        """Queued cost ahead of it for ``waits_for`` when scored (None: the answer does not use it)."""
        self.expires = expires
        """The earliest time a time test it went through can flip (a little early, to be safe)."""
        self.threshold = threshold
        """Rule 5: in-flight FLOPs below which a worker without a match may beat waiting (else None)."""
        self.deferred = deferred
        """The job's spill was deferred (first pass of a pump): this vouches only that its best worker, still
        saturated, and its cost there are unchanged, so a first pass leaves the job as it is (waiting for that
        worker at that cost) whether it would defer its spill again or wait; not whether it would spill."""
        self.clean = True

    def dirty(self) -> None:
        if self.clean:
            self.clean = False
            self.owner.mark_dirty(self.job)


class QueueLog(deque):
    """The scheduler's queue. Numbers each job as it is appended (``number``): jobs only ever join at the
    end, so queue order is number order. A job appended into the scan window is new to the memo."""

    def __init__(self, on_append: Callable[[Job], None]) -> None:
        super().__init__()
        self._on_append = on_append
        self.number: dict[Job, int] = {}
        """Queued job -> its number (kept after it leaves; ``forget`` drops it)."""
        self._next = 0

    def append(self, job: Job) -> None:
        super().append(job)
        self._next += 1
        self.number[job] = self._next
        if len(self) <= PUMP_SCAN_LIMIT:
            self._on_append(job)

    def forget(self, job: Job) -> None:
        self.number.pop(job, None)


class RunningSums:
    """``Scheduler.pump``'s running sums of the waiting costs of the jobs a pump passed and kept, per
    worker, added up in queue order when first asked for (what ``AheadCosts.get`` answers)."""

    __slots__ = ("passed", "sums", "added")

    def __init__(self) -> None:
        self.passed: list[Job] = []
        """Jobs the pump passed and kept, in queue order (their waits are final for this pump)."""
        self.sums: dict[str, float] = {}
        self.added = 0

    def get(self, worker_id: str, default: float = 0.0, /) -> float:
        passed, sums = self.passed, self.sums
        for i in range(self.added, len(passed)):
            job = passed[i]
            if job.waiting_for is not None:
                sums[job.waiting_for] = sums.get(job.waiting_for, 0.0) + job.waiting_cost
        self.added = len(passed)
        return sums.get(worker_id, default)


def watch_slots(lists: dict[int, list[Certificate]], mask: int, c: Certificate) -> None:
    while mask:
        low = mask & -mask
        lists.setdefault(low.bit_length() - 1, []).append(c)
        mask ^= low


def break_slots(lists: dict[int, list[Certificate]], slot: int) -> None:
    certs = lists.pop(slot, None)
    if certs:
        for c in certs:
            c.dirty()


def uses_ahead(c: Certificate | None) -> bool:
    return c is None or c.ahead is not None
