"""What the simulator's memo (``memo``) keeps per queued job: why its last scoring still holds.

``Certificate``: the facts a ``longest_block_match`` job's "still waiting" answer depended on; an event
that touches any of them makes it dirty, which puts the job back among those the next pump scores.
``QueueLog``: the scheduler's queue, numbering jobs as they are appended (queue order = number order).
``Waiters``: queued jobs by the worker they wait for, in queue order: the queued waiting cost ahead of any
job for any worker (``Scheduler.pump``'s running sums) without passing the jobs in between.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from operator import itemgetter
from typing import Protocol

from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.load_order import LoadOrder
from sgl_moe.router.placement.scheduler import PUMP_SCAN_LIMIT


class DirtySink(Protocol):
    """Who learns that a certificate broke (the memo scheduler)."""

    def mark_dirty(self, job: Job) -> None: ...

    def mark_held_revisit(self, job: Job, worker: Worker) -> None: ...


class Certificate:
    """Why a queued job's last scoring still holds (see the module docstring)."""

    __slots__ = ("job", "view", "waits_for", "ahead", "expires", "threshold", "clean", "owner", "deferred",
                 "needs_room", "matched", "spill_due")

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
        self.needs_room: Worker | None = None
        """A held job's best worker: the answer (held there) stands only while that worker has room. While it is
        saturated the job is scored whenever a pass reaches it (``revisit``); once it has room again, the job
        is held as before (nothing else it depends on moves with that worker's saturation alone)."""
        self.matched = 0
        """Rule 5: the slots holding a prefix of the job (a spill goes to the lightest worker outside them)."""
        self.spill_due = False
        """Rule 5: a worker got lighter than ``threshold``; until the memo checks the lightest worker without a
        match again, the answer is "wait" or a spill, which only a scoring tells apart (``holds`` is False)."""
        self.clean = True

    @property
    def kind(self) -> str:
        if self.deferred:
            return "deferred"
        if self.ahead is None:
            return "held"
        return "rule5" if self.threshold is not None else "waiting"

    def dirty(self) -> None:
        """The answer may have changed: the job is scored when a pass next reaches it."""
        if self.clean:
            self.clean = False
            self.owner.mark_dirty(self.job)

    def revisit(self) -> None:
        """``needs_room`` got saturated: the job is visited by the next pass, which scores it only if that worker
        is still saturated then (``holds``)."""
        self.owner.mark_dirty(self.job)

    def revisit_held(self) -> None:
        """``revisit`` of a held job whose ``needs_room`` got saturated (the memo may drop the visit again if that
        worker has room before a pass reaches the job: ``MemoScheduler.mark_held_revisit``)."""
        self.owner.mark_held_revisit(self.job, self.needs_room)

    def holds(self) -> bool:
        """Clean, no spill may be due, and a held job's worker has room."""
        return self.clean and not self.spill_due and (self.needs_room is None or self.needs_room.admissible)


class QueueLog(deque):
    """The scheduler's queue. Numbers each job as it is appended (``number``): jobs only ever join at the
    end, so queue order is number order. ``on_append(job, in_window)`` learns of each: a job appended into
    the scan window is new to the memo."""

    def __init__(self, on_append: Callable[[Job, bool], None]) -> None:
        super().__init__()
        self._on_append = on_append
        self.number: dict[Job, int] = {}
        """Queued job -> its number (kept after it leaves; ``forget`` drops it)."""
        self._next = 0

    def append(self, job: Job) -> None:
        super().append(job)
        self._next += 1
        self.number[job] = self._next
        self._on_append(job, len(self) <= PUMP_SCAN_LIMIT)

    def forget(self, job: Job) -> None:
        self.number.pop(job, None)

    def drop(self, job: Job) -> None:
        """Remove queued ``job`` and forget its number (queue order is number order: found by bisection)."""
        number = self.number
        n = number.get(job)
        i = bisect_left(self, n, key=number.__getitem__) if n is not None else len(self)
        if i == len(self) or self[i] is not job:
            raise RuntimeError(f"job {job.rid} is not queued")
        del self[i]
        del number[job]

    def drop_all(self, jobs: list[Job]) -> None:
        """``drop`` each of ``jobs``, in one sweep of the queue's head up to the last of them (a pass places a few
        jobs of its scan window: one sweep instead of a search and a deletion inside the deque for each)."""
        if len(jobs) == 1:
            self.drop(jobs[0])
            return
        number = self.number
        gone = set(jobs)
        if len(gone) != len(jobs) or any(job not in number for job in gone):
            raise RuntimeError("the jobs to drop are not distinct queued jobs")
        popleft = self.popleft
        keep = []
        left = len(gone)
        while left:
            job = popleft()
            if job in gone:
                del number[job]
                left -= 1
            else:
                keep.append(job)
        self.extendleft(reversed(keep))


_number = itemgetter(0)


class Waiters:
    """Queued jobs that wait for a worker, per worker, in queue order (``(number, job)``).

    During a pump every queued job's ``waiting_for`` is its answer of this pump (scored, or vouched for),
    and placed jobs are dropped at once, so the sum of the waiting costs of the jobs ahead of ``job`` is
    ``Scheduler.pump``'s running sum when it reaches ``job`` (``AheadCosts.get``), added in the same order.
    """

    __slots__ = ("by_worker", "number", "job")

    def __init__(self, number: dict[Job, int]) -> None:
        self.by_worker: dict[str, list[tuple[int, Job]]] = {}
        self.number = number
        """The queue's numbers (``QueueLog.number``)."""
        self.job: Job | None = None
        """The job the pump is at (``get`` sums what is ahead of it)."""

    def moved(self, job: Job, before: str | None) -> None:
        """``job`` waited for ``before`` and now waits for ``job.waiting_for`` (either may be None)."""
        n = self.number.get(job)
        if n is None or before == job.waiting_for:
            return
        if before is not None:
            self._remove(before, n)
        if job.waiting_for is not None:
            insort(self.by_worker.setdefault(job.waiting_for, []), (n, job), key=_number)

    def left(self, job: Job, before: str | None) -> None:
        """``job``, which waited for ``before``, left the queue."""
        n = self.number.get(job)
        if n is not None and before is not None:
            self._remove(before, n)

    def behind(self, worker_id: str, n: int) -> list[Job]:
        """Jobs after number ``n`` that wait for the worker."""
        jobs = self.by_worker.get(worker_id)
        if not jobs:
            return []
        return [job for _, job in jobs[bisect_left(jobs, n + 1, key=_number):]]

    def get(self, worker_id: str, default: float = 0.0, /) -> float:
        jobs = self.by_worker.get(worker_id)
        if not jobs:
            return default
        n = self.number[self.job]
        total: float | None = None
        for m, job in jobs:
            if m >= n:
                break
            total = job.waiting_cost if total is None else total + job.waiting_cost
        return default if total is None else total

    def _remove(self, worker_id: str, n: int) -> None:
        jobs = self.by_worker[worker_id]
        i = bisect_left(jobs, n, key=_number)
        if i == len(jobs) or jobs[i][0] != n:
            raise RuntimeError(f"queued job {n} is not listed as waiting for {worker_id}")
        del jobs[i]


def break_slots(lists: dict[int, list[Certificate]], slot: int) -> None:
    certs = lists.pop(slot, None)
    if certs:
        for c in certs:
            c.dirty()


def uses_ahead(c: Certificate | None) -> bool:
    return c is None or c.ahead is not None
