"""The quarantine lane: suspects (``suspects``) run one at a time, each alone on a healthy worker.

A suspect's run tells innocent from poison only if nothing else runs with it: the lane lets one suspect in at a
time (a FIFO lock held until its call ends), picks the routable worker with the least in flight (never one the
suspect was running on when it died), and books the suspect there at once with a cost of at least the worker's Θ
(``Scheduler.book``), so admission gives that worker nothing more. It then waits for the requests already
running there to finish and hands the placement over; the caller's call releases it as any placement. A worker
that leaves rotation meanwhile is given back and another chosen. The wait is bounded by ``--queue-timeout-s``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from sgl_moe.router.membership.worker import HEALTHY, Worker
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.candidates import score_all
from sgl_moe.router.placement.job import Job, Placement
from sgl_moe.router.placement.scheduler import NoWorkers, QueueTimeout, Scheduler

log = logging.getLogger("sgl_moe.router")

RECHECK_S = 0.5
"""Longest the lane sleeps without a capacity signal before it looks at its worker again (health changes
send none)."""


class QuarantineLane:
    """``enter(job)`` waits for the lane and a worker to run the suspect alone; ``leave()`` after its call."""

    def __init__(self, scheduler: Scheduler, pool: WorkerPool, timeout_s: float) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._waiting = 0
        """Suspects waiting for their worker to drain (``notify`` sets ``_changed`` only for them: it runs on every
        finished request and KV-event batch)."""
        self.runs = 0
        """Suspects run alone."""

    def notify(self) -> None:
        """Capacity changed (a request ended, a worker joined): a waiting suspect looks again."""
        if self._waiting:
            self._changed.set()

    async def enter(self, job: Job) -> Placement:
        """The lane, and a placement of ``job`` alone on a worker; raises NoWorkers or QueueTimeout (the lane is
        then left). The caller must call ``leave`` after the placement's call."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._lock.acquire()
                try:
                    return await self._alone(job)
                except BaseException:
                    self._lock.release()
                    raise
        except TimeoutError:
            raise QueueTimeout(f"the request was running on a worker that died; no worker could run it alone "
                               f"within {self.timeout_s:.0f} s (--queue-timeout-s)") from None

    def leave(self) -> None:
        self._lock.release()

    async def _alone(self, job: Job) -> Placement:
        while True:
            workers = self.pool.routable(job.exclude)
            if not workers:
                raise NoWorkers("no healthy worker is available to run the request alone")
            target = min(workers, key=lambda w: (w.inflight_requests, w.inflight_flops, w.id))
            placement = self._book(job, target)
            try:
                if await self._drained(target):
                    self.runs += 1
                    log.warning("request %s runs alone on worker %s (quarantine lane)", job.rid, target.id)
                    return placement
            except BaseException:
                self.scheduler.release(placement, ok=False)
                raise
            self.scheduler.release(placement, ok=False)  # it left rotation: choose again

    def _book(self, job: Job, worker: Worker) -> Placement:
        [c] = score_all(self.scheduler.index, job, [worker])
        c = replace(c, cost=max(c.cost, worker.theta))  # at or above Θ: admission gives the worker nothing more
        return self.scheduler.book(job, c, f"quarantine: alone on {worker.id}")

    async def _drained(self, worker: Worker) -> bool:
        """True once the suspect's booking is all that runs on ``worker``; False if it left rotation first."""
        while worker.inflight_requests > 1:
            if worker.state != HEALTHY or worker.id not in self.pool.workers:
                return False
            self._changed.clear()
            self._waiting += 1
            try:
                async with asyncio.timeout(RECHECK_S):
                    await self._changed.wait()
            except TimeoutError:
                pass
            finally:
                self._waiting -= 1
        return worker.state == HEALTHY
