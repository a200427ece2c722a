"""Admission: when a request runs, and the reservation that keeps workers below Θ.

- **Admission**: a worker whose in-flight FLOPs are at or above its Θ is given nothing more. The
  reservation (in-flight += cost, ``candidates.job_cost``) is made in the same synchronous step as the
  choice, so concurrent dispatches cannot overshoot; it is released, in the same unit, when the request ends.
- **Queue**: requests no worker can take wait in one global FIFO queue and are re-scored whenever
  capacity appears. A request waiting for its saturated best-matching worker does not block the
  requests behind it (no head-of-line blocking).
- **Prefix wait**: a request whose best match ends in blocks only promised by a request still running
  there waits for them to be stored (``RouterConfig.prefix_wait_s``; the rule is ``prefix_hold``'s, and the
  scheduler acts on its verdict).
- **Placement** has two paths that choose the same worker: with one Θ and one FLOPs model for all
  workers (``LoadOrder.uniform``) the ``FastPath`` scores the workers holding a prefix of the request plus
  the least-loaded admissible rest, found in a view sorted by in-flight FLOPs; otherwise (and for debug
  logs, which list every worker) every worker is scored (``candidates.score_all``). The choice itself is
  the ``PlacementPolicy``'s. A job without block keys (``Job.affinity`` False) is placed by load alone on
  both paths.
- **Time** comes from ``clock`` (``time.monotonic`` by default), so a simulator can drive the scheduler
  on a virtual clock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.candidates import Candidate, score_all
from sgl_moe.router.placement.fast_path import FastPath
from sgl_moe.router.placement.job import Job, Placement
from sgl_moe.router.placement.load_order import LoadOrder
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.policy import DEFERRED, SPILL, PlacementPolicy
from sgl_moe.router.placement.prefix_hold import PrefixHold
from sgl_moe.router.placement.prefix_hold import theta_is_measured as theta_is_measured  # re-exported (simulator)

log = logging.getLogger("sgl_moe.router.decisions")

SPILL_PREFIX = SPILL + ":"

PUMP_SCAN_LIMIT = 256
"""Queued requests re-scored per pump; those behind wait for the next one."""


class QueueFull(Exception):
    def __init__(self, depth: int, retry_after_s: int) -> None:
        super().__init__(f"admission queue is full ({depth} requests waiting)")
        self.retry_after_s = retry_after_s


class QueueTimeout(Exception):
    pass


class NoWorkers(Exception):
    pass


def refusal(exc: QueueFull | QueueTimeout | NoWorkers) -> dict[str, Any]:
    """``error_response``'s arguments for a request placement refused: 429 when the queue is full, else 503."""
    if isinstance(exc, QueueFull):
        return {"status": 429, "message": f"router busy: {exc}; retry later", "kind": "rate_limit_exceeded",
                "headers": {"Retry-After": str(exc.retry_after_s)}}
    return {"status": 503, "message": str(exc), "kind": "unavailable", "headers": {"Retry-After": "5"}}


@dataclass
class SchedulerStats:
    dispatched: int = 0
    queued: int = 0
    rejected_queue_full: int = 0
    queue_timeouts: int = 0
    spills: int = 0
    prefix_waits: int = 0
    pumps: int = 0
    """Queue scans (``pump``: releases, stored blocks, a new Θ)."""
    rescored: int = 0
    """Queued requests scored again by a pump (the router's CPU in a backlog goes mostly here)."""
    decision_seconds: list[float] = field(default_factory=list)


class AheadCosts(Protocol):
    """During a pump: FLOPs of the queued jobs already passed that wait for each worker."""

    def get(self, worker_id: str, default: float = 0.0, /) -> float: ...


class Scheduler:
    """Places requests on workers (``acquire``), queues what no worker can take, and releases (``release``).

    Hooks for the simulator, which drives this scheduler without awaiting and subclasses it to skip
    re-scoring queued jobs whose answer cannot have changed (``sgl_moe.simulator.memo``):

    - methods ``try_place``, ``pump``, ``release`` (overridable), ``reserved`` (called after each
      reservation), ``uniform_view``, ``any_admissible`` and the property ``view``;
    - attributes ``queue`` (a deque; a subclass may replace it with a deque subclass before any job
      arrives), ``stats``, ``clock``, ``scan_all`` and ``ahead`` (a pump override installs its own
      running sums there for its scan and restores the previous value after); ``policy`` (the
      ``PlacementPolicy``: a pump override sets its ``defer_spills`` for a first pass, and may hand its
      ``next_round_robin`` a shorter list of the workers that may have room), ``fast_path`` and
      ``last_deferred`` (whether the last queued job's spill was deferred).
    """

    def __init__(self, cfg: RouterConfig, pool: WorkerPool, index: BlockIndex, ledger: PendingLedger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.pool = pool
        self.index = index
        self.ledger = ledger
        self.clock = clock
        """Seconds on a monotonic clock: queue waits, affinity waits and promise completion times."""
        self.queue: deque[Job] = deque()
        self.stats = SchedulerStats()
        self.queue_wait: deque[float] = deque(maxlen=4096)
        self.scan_all = False
        """Score every worker on every decision (the reference path; debug logging also takes it)."""
        self.ahead: AheadCosts | None = None
        """Hook: during a pump, FLOPs of the jobs already passed that wait for each worker (see
        ``queued_cost_before``); None outside pumps."""
        self.policy = PlacementPolicy(cfg, clock, self.stats, self.queued_cost_before)
        self.fast_path = FastPath(cfg, index, self.policy)
        self.holds = PrefixHold(
            enabled=cfg.policy == "longest_block_match" and cfg.prefix_wait_s > 0, wait_s=cfg.prefix_wait_s,
            min_tokens=cfg.prefix_wait_min_tokens, spills=cfg.hold_spills, committed_prefix=index.committed_prefix,
            routable=pool.routable, queued_cost_before=self.queued_cost_before, clock=clock)
        self.last_deferred = False
        """Whether the last ``try_place`` that queued its job did so because its spill was deferred."""
        self._view: LoadOrder | None = None
        self._decision_window: deque[float] = deque(maxlen=4096)
        self.pump_soon: Callable[[], None] | None = None
        """Hook: what ``release`` calls to pump (None: ``pump`` at once). The router sets its once-per-turn pump
        (``Router._on_capacity``): the releases of one finished batch arrive together, and each pump re-scores
        up to ``PUMP_SCAN_LIMIT`` queued jobs, so one pump after all of them does the work of many. The simulator
        sets one that pumps after each engine step's releases."""
        self.on_load: Callable[[Worker], None] | None = None
        """Hook: told after this router's own load on a worker changed (a booking or a release); the replica link
        (``--peers``) publishes it."""

    # -- requests --------------------------------------------------------------------------------
    async def acquire(self, job: Job) -> Placement:
        """A placement with its reservation made; waits in the FIFO queue when no worker has room."""
        if not self.pool.routable(job.exclude):
            raise NoWorkers("no healthy worker is available" if self.pool.workers else "no worker is registered")
        if not self.queue:
            placement = self.try_place(job)
            if placement is not None:
                return placement
        if len(self.queue) >= self.cfg.queue_size:
            self.stats.rejected_queue_full += 1
            retry = self._retry_after()
            log.warning("rejecting %s: admission queue full (%d waiting); Retry-After %d s",
                        job.rid, len(self.queue), retry)
            raise QueueFull(len(self.queue), retry)
        loop = asyncio.get_running_loop()
        job.future = loop.create_future()
        job.queued = True
        self.queue.append(job)
        self.stats.queued += 1
        self.pump()
        timer = loop.call_later(self.cfg.queue_timeout_s, self._expire, job)
        # Awaits the future itself, not ``asyncio.wait_for``: on Python 3.11 that returns the result when the
        # waiter is cancelled in the turn its future resolves, and the cancellation is lost (a placement owner
        # that had already handled the front's Cancel then held the reservation for good).
        try:
            return await job.future
        except asyncio.CancelledError:
            if job.future.done() and not job.future.cancelled():
                if job.future.exception() is None:
                    # Placed in the same instant the client left: give the reservation back.
                    self.release(job.future.result(), ok=False)
            else:
                self._drop(job)
            raise
        finally:
            timer.cancel()
            # The future holds the placement (or the exception), and the placement holds the job: a cycle per queued
            # request that only the cyclic collector would free, 2-3% of the live router's CPU in its passes.
            job.future = None

    def _expire(self, job: Job) -> None:
        """``--queue-timeout-s`` passed with ``job`` still queued: it leaves the queue with ``QueueTimeout``."""
        if job.future is None or job.future.done():
            return
        self._drop(job)
        self.stats.queue_timeouts += 1
        job.future.set_exception(QueueTimeout(f"no worker admitted the request within "
                                              f"{self.cfg.queue_timeout_s:.0f} s"))

    def release(self, placement: Placement, *, ok: bool) -> None:
        """The request ended: give back its reservation and settle its pending blocks, then pump.

        Hook: overridable (the simulator's memo notes the load change first, then calls this)."""
        if placement.released:
            return
        placement.released = True
        worker = placement.worker
        worker.inflight_requests -= 1
        worker.note_finished(placement.cost, self.clock())
        before = worker.inflight_flops
        # The same number that was added at dispatch; exactly the other replicas' share when idle (no float residue).
        worker.inflight_flops = (worker.inflight_flops - placement.cost if worker.inflight_requests
                                 else worker.peer_flops)
        if self._view is not None:
            self._view.moved(worker, before)
        if self.on_load is not None:
            self.on_load(worker)
        if placement.promise is not None:
            if ok:
                self.ledger.complete(placement.promise, now=self.clock())
            else:
                self.ledger.fail(placement.promise)
        if self.pump_soon is not None:
            self.pump_soon()
        else:
            self.pump()

    def set_peer_load(self, worker: Worker, flops: float) -> None:
        """The other router replicas now have ``flops`` in flight on ``worker`` (``replicas.peer_tables``): its load
        moves by the change, and a drop may let queued requests run."""
        before = worker.inflight_flops
        old, worker.peer_flops = worker.peer_flops, flops
        worker.inflight_flops = before + flops - old if worker.inflight_requests else flops
        if self._view is not None:
            self._view.moved(worker, before)
        if flops < old:
            if self.pump_soon is not None:
                self.pump_soon()
            else:
                self.pump()

    def pump(self) -> None:
        """Place queued requests, in FIFO order, while some worker has room: two passes over the queue.

        The first pass places what runs without a spill (``PlacementPolicy.defer_spills``): a worker with
        room takes the queued jobs that match it or match nothing anywhere before it recomputes another
        worker's prefix. The second pass, only when some worker still has room and the first deferred a
        spill, lets the deferred jobs spill into that room (it would idle otherwise): in a backlog this is
        spilling by throughput, not only by each job's finish time. Without a backlog (one job) the two
        passes decide what one would.

        Nothing here awaits, so the queue and the workers change only through this loop: whether any
        worker has room changes only when a job is placed, and the jobs before the current one are
        exactly those this loop kept, which lets it keep their waiting costs as running sums (``ahead``).
        Hook: overridable (the simulator's memo scans only the jobs whose answer may have changed).
        """
        policy = self.policy
        self.stats.pumps += 1
        policy.defer_spills = True
        try:
            deferred = self._pump_pass()
        finally:
            policy.defer_spills = False
        if deferred:
            self._pump_pass()

    def _pump_pass(self) -> bool:
        """One FIFO scan of the queue (``pump``); True if the policy deferred a spill and room remains."""
        scanned = 0
        queue = self.queue
        room: bool | None = None  # whether some worker has room; computed when first needed
        outer, ahead = self.ahead, {}
        self.ahead = ahead
        deferred = False
        try:
            i = 0
            while i < len(queue):
                job = queue[i]
                if job.future is None or job.future.done():
                    del queue[i]
                    continue
                if not self.pool.routable(job.exclude):
                    job.future.set_exception(NoWorkers("no healthy worker is available"))
                    del queue[i]
                    continue
                if room is None:
                    room = self.any_admissible()
                if not room or scanned >= PUMP_SCAN_LIMIT:
                    break
                scanned += 1
                self.last_deferred = False
                placement = self.try_place(job)
                if placement is not None:
                    job.future.set_result(placement)
                    del queue[i]
                    room = None
                    continue
                deferred = deferred or self.last_deferred
                if job.waiting_for is not None:
                    ahead[job.waiting_for] = ahead.get(job.waiting_for, 0.0) + job.waiting_cost
                i += 1
        finally:
            self.ahead = outer
            self.stats.rescored += scanned
        return deferred and (room if room is not None else self.any_admissible())

    def decision_times(self) -> list[float]:
        return list(self._decision_window)

    # -- placement ---------------------------------------------------------------------------------
    def try_place(self, job: Job) -> Placement | None:
        """Place ``job`` now, its reservation made, or None (no room, or it waits for a worker or for blocks).

        Hook: ``acquire`` and ``pump`` place through this method; the simulator calls it for a request
        that finds the queue empty (``acquire`` without awaiting), and its memo overrides it.
        """
        t0 = time.perf_counter()
        workers = self.pool.routable(job.exclude)
        debug = log.isEnabledFor(logging.DEBUG)
        view = None
        if workers and not job.exclude and not self.scan_all and not debug:
            view = self.uniform_view(workers)
        if view is not None:
            decision = self.fast_path.decide(job, view, workers)
        else:
            decision = self.policy.choose(job, score_all(self.index, job, workers))
        if decision is None:
            return None
        candidate, reason = decision
        if candidate is None:  # the job waits for a saturated worker (or its spill waits for the second pass)
            self.last_deferred = reason.startswith(DEFERRED)
            if debug:
                log.debug("queue %s: %s", job.rid, reason)
            self._note_decision(t0)
            return None
        return self._reserve(job, candidate, reason, t0, debug)

    def reserved(self, placement: Placement) -> None:
        """Hook: called right after each reservation, before the placement is returned (no-op here; the
        simulator's memo notes that the worker's load changed)."""

    @property
    def view(self) -> LoadOrder | None:
        """Hook: the load-ordered view of the routable workers last built (``uniform_view``), if any."""
        return self._view

    def uniform_view(self, workers: list[Worker]) -> LoadOrder | None:
        """The load-ordered view of ``workers`` (rebuilt when the routable list changed or the pool installed an
        info since: ``WorkerPool.installs``), if uniform.

        Hook: the simulator's memo compares views to know when the routable set changed."""
        view = self._view
        installs = self.pool.installs
        if view is None or view.stale or view.built_after != installs or view.key != tuple(workers):
            view = self._view = LoadOrder(workers, installs)
        return view if view.uniform else None

    def any_admissible(self) -> bool:
        """Whether some routable worker is below Θ (hook: the room test of a pump override)."""
        view = None if self.scan_all else self.uniform_view(self.pool.routable())
        if view is not None:
            return view.any_admissible()
        return any(w.admissible for w in self.pool.workers.values())

    def queued_cost_before(self, job: Job, worker: Worker) -> float:
        """FLOPs of the requests ahead in the queue that also wait for ``worker``."""
        if self.ahead is not None:  # inside pump: the same sum, kept as the loop passes those jobs
            return self.ahead.get(worker.id, 0.0)
        ahead = 0.0
        for other in self.queue:
            if other is job:
                break
            if other.waiting_for == worker.id:
                ahead += other.waiting_cost
        return ahead

    def _hold_for_prefix(self, job: Job, c: Candidate) -> Candidate | None:
        """None if ``job`` should wait for blocks ``c`` only has promised; else the candidate to reserve
        (``prefix_hold.PrefixHold.check``, whose verdict this acts on)."""
        holds = self.holds
        if not holds.enabled:
            return c  # (``check``'s verdict without holds: the candidate itself, nothing to act on)
        verdict = holds.check(job, c, self.policy.defer_spills)
        if verdict.spill_deferred:
            self.last_deferred = True
        if verdict.rescore_in is not None:
            self.stats.prefix_waits += 1
            try:  # re-score when the wait runs out even if nothing else happens meanwhile
                asyncio.get_running_loop().call_later(verdict.rescore_in, self.pump)
            except RuntimeError:  # no event loop (simulator, unit tests drive pump themselves)
                pass
        return verdict.candidate

    def _reserve(self, job: Job, c: Candidate, reason: str, t0: float, debug: bool = False) -> Placement | None:
        held = self._hold_for_prefix(job, c)
        if held is None:
            self._note_decision(t0)
            return None
        if held is not c:
            if held.worker is not c.worker:
                reason = (f"{SPILL}: {c.worker.id}'s matched blocks are still being computed and the duplicate "
                          f"would pass its Θ; recomputing here finishes sooner than waiting there")
            else:
                reason += "; promised blocks recomputed in the same batch (room below Θ)"
            c = held
        return self.book(job, c, reason, t0, debug)

    def book(self, job: Job, c: Candidate, reason: str, t0: float | None = None, debug: bool = False) -> Placement:
        """Reserve ``c.cost`` on ``c.worker`` for ``job`` and promise its blocks there: the placement, made now.

        Hook: the quarantine lane books a suspect this way with a cost of at least the worker's Θ, so that nothing
        else is admitted there until it is released."""
        w = c.worker
        now = self.clock()
        before = w.inflight_flops
        w.inflight_flops = before + c.cost
        view = self._view
        if view is not None:
            view.moved(w, before)
        if self.on_load is not None:
            self.on_load(w)
        w.note_started(now)
        inflight = w.inflight_requests = w.inflight_requests + 1
        if inflight > w.peak_inflight_requests:
            w.peak_inflight_requests = inflight
        w.counters.requests += 1
        # Promise the blocks the target does not already hold: the matched prefix is there (committed or
        # promised by an earlier request) and stays counted through that request's promise.
        job_keys = job.keys
        one = len(job_keys) == 1
        keys = job_keys[0][c.matched_blocks:] if one else list(dict.fromkeys(k for ks in job_keys for k in ks))
        promise = self.ledger.promise(job.rid, c.slot, keys) if keys else None
        homes = self.policy.homes
        if homes is not None and one and job_keys[0]:
            homes.record(job_keys[0], w.id)
        decision = self._note_decision(time.perf_counter() if t0 is None else t0)
        queued = now - job.arrived
        stats = self.stats
        stats.dispatched += 1
        if reason.startswith(SPILL_PREFIX):
            stats.spills += 1
        if job.future is not None:
            self.queue_wait.append(queued)
        predicted = c.cached_tokens[0] if len(c.cached_tokens) == 1 else sum(c.cached_tokens)
        if debug:
            log.debug("route %s -> %s rank %d: %s; cost %.3g FLOPs, in-flight %.3g -> %.3g of Θ %.3g; "
                      "predicted cached %d tokens; queued %.3f s; decision %.1f us",
                      job.rid, w.id, c.dp_rank, reason, c.cost, before, w.inflight_flops, w.theta,
                      predicted, queued, decision * 1e6)
        placement = Placement(job, w, c.slot, c.dp_rank, c.cost, predicted, c.matched_blocks, reason, queued,
                              decision, promise)
        self.reserved(placement)
        return placement

    def _note_decision(self, t0: float) -> float:
        dt = time.perf_counter() - t0
        self._decision_window.append(dt)
        return dt

    def _drop(self, job: Job) -> None:
        try:
            self.queue.remove(job)
        except ValueError:
            pass

    def _retry_after(self) -> int:
        waits = list(self.queue_wait)[-64:]
        return max(1, math.ceil(sum(waits) / len(waits))) if waits else 1
