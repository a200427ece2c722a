"""Health checks of the pool's workers: out of rotation after repeated failures, back in when they answer.

A worker that answers again is re-read: a new instance id means it restarted with an empty cache, so its
committed tables are dropped and its new info (and Θ) installed. A worker added while it was still
calibrating Θ is re-read on each check until the calibrated value arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import aiohttp

from sgl_moe.router.membership.discovery import Discovery
from sgl_moe.router.membership.worker import HEALTHY, STARTING, UNHEALTHY, Worker, WorkerError

if TYPE_CHECKING:
    from sgl_moe.router.membership.worker_pool import WorkerPool

log = logging.getLogger("sgl_moe.router.workers")


class HealthMonitor:
    """The pool's health loop (``run``) and what a check decides for one worker (``check``)."""

    def __init__(self, pool: WorkerPool, discovery: Discovery) -> None:
        self.pool = pool
        self.discovery = discovery
        self.busy_probes = 0
        """Probes that failed while the worker was making progress (not counted against it)."""

    async def run(self) -> None:
        pool = self.pool
        while True:
            await asyncio.sleep(pool.cfg.health_interval_s)
            await asyncio.gather(*(self.check(w) for w in list(pool.workers.values())), return_exceptions=True)
            pool.ledger.expire()

    async def check(self, worker: Worker) -> None:
        """One probe. Refused: out of rotation at once (the process is gone). Timed out or failing: counts toward
        ``--health-failures`` only when the worker is not ``busy`` — SGLang's ``/health`` waits for the
        scheduler, so a busy worker answers it late."""
        pool = self.pool
        started = time.monotonic()
        refused = False
        try:
            async with await self.discovery.get(f"{worker.url}/health", timeout=pool.cfg.health_timeout_s) as r:
                ok = r.status == 200
                reason = f"GET /health answered {r.status}"
        except aiohttp.ClientConnectorError as exc:
            ok, refused, reason = False, True, f"GET /health: connection failed ({type(exc).__name__})"
        except (TimeoutError, aiohttp.ClientError) as exc:
            ok, reason = False, f"GET /health failed: {type(exc).__name__}"
        if worker.id not in pool.workers:
            return
        if ok:
            worker.health_failures = 0
            if worker.state in (UNHEALTHY, STARTING):
                await self.readmit(worker)
            elif worker.info.calibrating:
                await self.refresh_theta(worker)
            return
        if refused:
            worker.last_error = reason
            pool.mark_unhealthy(worker, reason)
            return
        if worker.state == HEALTHY and self.busy(worker, started):
            worker.health_failures = 0
            self.busy_probes += 1
            log.debug("worker %s: %s, but it is busy, not dead (%d requests in flight, last progress %.1f s ago)",
                      worker.id, reason, worker.inflight_requests, time.monotonic() - worker.last_progress)
            return
        worker.health_failures += 1
        worker.last_error = reason
        if worker.state == HEALTHY and worker.health_failures >= pool.cfg.health_failures:
            pool.mark_unhealthy(worker, reason)

    def busy(self, worker: Worker, started: float) -> bool:
        """A probe that failed (not refused) says nothing against a worker that made progress since just before
        it, or that has requests in flight and made progress within ``--health-stall-s`` (one long batch on a
        loaded CPU can take longer than a probe interval without finishing anything)."""
        cfg = self.pool.cfg
        if worker.last_progress >= started - cfg.health_interval_s:
            return True
        return worker.inflight_requests > 0 and time.monotonic() - worker.last_progress < cfg.health_stall_s

    async def refresh_theta(self, worker: Worker) -> None:
        """The worker was still calibrating Θ when added: re-read its info until the calibrated value arrives."""
        try:
            info = await self.discovery.fetch_info(worker.url)
        except WorkerError:
            return
        if info.instance_id != worker.instance_id or info.calibrating:
            return
        old = worker.theta
        self.pool.install(worker, info)
        if self.pool.cfg.saturation_flops is None:
            log.info("worker %s Θ %s: %.4g -> %.4g FLOPs (%s)", worker.id, info.saturation.state, old, worker.theta,
                     info.saturation.source)
            self.pool.on_change()  # a larger Θ may admit queued work now

    async def readmit(self, worker: Worker) -> None:
        pool = self.pool
        try:
            info = await self.discovery.fetch_info(worker.url)
        except WorkerError as exc:
            worker.last_error = exc.message
            return
        if info.instance_id != worker.instance_id:
            worker.counters.restarts += 1
            for rank, slot in worker.slots.items():
                dropped = pool.index.clear_committed(slot)
                log.info("worker %s restarted (new instance %s): dropped %d committed blocks of rank %d",
                         worker.id, info.instance_id, dropped, rank)
            pool.install(worker, info)
        elif worker.info.calibrating and not info.calibrating:  # its start-up profile ended
            pool.install(worker, info)
            log.info("worker %s ready: Θ %s, %.4g FLOPs (%s)", worker.id, info.saturation.state, worker.theta,
                     info.saturation.source)
        pool.mark_healthy(worker)
