"""The project's router in the simulation: its own Scheduler, BlockIndex, PendingLedger and event sink.

Nothing of the decision logic is re-implemented here. Per request the frontend does what
``Scheduler.acquire`` does without awaiting: place at once when the queue is empty, else append to
the scheduler's FIFO queue and ``pump``; the completions of one engine step each call ``Scheduler.release``,
then one pump follows (the router's ``pump_soon``). The
scheduler reads the virtual clock; it is the router's ``Scheduler`` with the exact re-scoring memo of
``memo`` (``SimConfig.memo=False`` runs it without). Workers are real ``Worker`` objects admitted with
a ``WorkerInfo`` into a ``WorkerPool`` without HTTP; KV events go through the pool's event sink
(``pool.events.on_batch``) into the committed tables exactly as the router's event listeners deliver
them (stored blocks pump the queue, as the router's ``on_change`` does), and the timer the router arms
for a request held for promised blocks is an event on the virtual clock. Only hooks the router
publishes for this are used (``tests/simulator/test_hooks.py`` lists them).

Offline runs (every request sent at t=0) put the whole stream into the router's queue. Only the head
of that queue is ever scanned (``PUMP_SCAN_LIMIT`` jobs per pump), so the frontend keeps just
``2 x PUMP_SCAN_LIMIT + 1`` jobs materialised and appends more as the head drains; a pump at t=0 for a
request that far back would change nothing, so the runs are the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping

from sgl_moe.router.config import Policy, RouterConfig
from sgl_moe.router.membership.event_listener import EventSource
from sgl_moe.router.membership.kv_events import BlockRemoved, BlockStored, EventBatch
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.job import Job, Placement
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.scheduler import PUMP_SCAN_LIMIT
from sgl_moe.simulator.engine import Engine
from sgl_moe.simulator.memo import LoggedBlockIndex, MemoScheduler
from sgl_moe.simulator.timeline import Timeline
from sgl_moe.simulator.timing_model import Calibration
from sgl_moe.simulator.units import SimUnit
from sgl_moe.wire import SaturationInfo, WorkerInfo

OFFLINE_WINDOW = 2 * PUMP_SCAN_LIMIT + 1
"""Queued jobs kept materialised in offline runs (see the module docstring)."""


class SimPool(WorkerPool):
    """The router's WorkerPool with its workers admitted from known infos instead of discovered over HTTP."""

    in_rotation: list[Worker] = []
    """Every worker: simulated workers never leave rotation."""

    @classmethod
    def of(cls, cfg: RouterConfig, index: BlockIndex, ledger: PendingLedger, infos: Mapping[str, WorkerInfo],
           on_change: Callable[[], None]) -> SimPool:
        """A pool of one worker per ``infos`` entry (worker id -> info), admitted in order."""
        pool = cls.without_http(cfg, index, ledger, on_change)
        for worker_id, info in infos.items():
            pool.admit(f"sim://{worker_id}", info, worker_id=worker_id)
        pool.in_rotation = list(pool.workers.values())
        return pool

    def routable(self, exclude: frozenset[str] = frozenset()) -> list[Worker]:
        # The list WorkerPool builds per call, built once.
        return self.in_rotation if not exclude else super().routable(exclude)


def worker_info(cal: Calibration, theta: float) -> WorkerInfo:
    """What a simulated worker reports in ``/sgl_moe/info``: the calibration's model, page size, FLOPs and Θ."""
    return WorkerInfo(model_name=cal.name, page_size=cal.page_size, flops=cal.flops,
                      saturation=SaturationInfo(flops=theta, source="simulator", state="fixed"))


class _Future:
    """What the scheduler's queue needs of a future: a result is handed over at once."""

    __slots__ = ("_done", "_deliver")

    def __init__(self, deliver) -> None:
        self._done = False
        self._deliver = deliver

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, placement: Placement) -> None:
        self._done = True
        self._deliver(placement)

    def set_exception(self, exc: BaseException) -> None:
        raise RuntimeError(f"simulated request failed in the router: {exc}")


class RouterFrontend:
    """Routes units through the router's scheduler to engines; ``submit`` / ``finished`` / ``kv_events``."""

    def __init__(self, policy: Policy, cal: Calibration, theta: float, engines: list[Engine], timeline: Timeline,
                 *, queue_size: int, max_affinity_wait_s: float, pending_ttl_s: float, event_delay_s: float,
                 prefix_wait_s: float = RouterConfig.prefix_wait_s, memo: bool = True,
                 request_overhead_flops: float = 0.0, hold_spills: bool = False) -> None:
        self.cfg = RouterConfig(policy=policy, saturation_flops=theta, queue_size=queue_size,
                                max_affinity_wait_s=max_affinity_wait_s, pending_ttl_s=pending_ttl_s,
                                prefix_wait_s=prefix_wait_s, hold_spills=hold_spills,
                                request_overhead_flops=request_overhead_flops)
        # hold_spills: the memo's certificates for held jobs do not yet watch the other workers' room, which the
        # router's hold-to-spill rule reads; a run with it goes without the memo.
        memo = memo and policy == "longest_block_match" and not hold_spills
        # The memo only ever vouches for longest_block_match jobs (the others wait only when no worker has room);
        # without it the router's own index serves (the logged one's bookkeeping would be spent for nothing).
        self.index = LoggedBlockIndex() if memo else BlockIndex()
        self.ledger = PendingLedger(self.index, ttl_s=pending_ttl_s)
        info = worker_info(cal, theta)
        self.pool = SimPool.of(self.cfg, self.index, self.ledger, {e.id: info for e in engines}, on_change=self.pump)
        self.workers = list(self.pool.workers.values())
        self.scheduler = MemoScheduler(self.cfg, self.pool, self.index, self.ledger, clock=timeline, memo=memo)
        self.scheduler.pump_soon = self._pump_soon
        self._pump_due = False
        self.engines = {e.id: e for e in engines}
        self.timeline = timeline
        self.event_delay_s = event_delay_s
        self.theta = theta
        self.page = cal.page_size
        self.sources = {w.id: EventSource(worker_id=w.id, dp_rank=0, endpoint=f"sim://{w.id}", replay_endpoint=None)
                        for w in self.workers}
        self.rejected = 0
        self.max_inflight_before = 0.0
        """Largest in-flight FLOPs a worker had when it was given a request (with admission: < Θ)."""
        self._units: dict[str, SimUnit] = {}
        self._placed: list[Placement] = []
        self._seq = itertools.count()
        self._backlog: Iterator[SimUnit] | None = None
        self._timed: set[str] = set()
        self.trace: list[tuple] | None = None
        """When a list: every operation on the router, for replaying it elsewhere (tests)."""
        self.on_placed: Callable[[Placement], None] | None = None
        """Hook: told of every placement right after its reservation (``replica_frontends`` measures true loads)."""
        self.dispatch: Callable[[Engine, SimUnit], None] | None = None
        """Hook: hands a placed unit to its engine instead of ``Engine.submit`` at once (``OwnerPlacement``
        delays the requests of other replicas by a message)."""

    # -- requests ----------------------------------------------------------------------------
    def submit(self, unit: SimUnit, arrived: float | None = None) -> bool:
        """``Scheduler.acquire`` without awaiting; False when the queue is full (the client got 429). ``arrived``:
        when the request reached this router, if not when the client sent it (``replica_frontends.OwnerPlacement``)."""
        if self.trace is not None:
            self.trace.append(("submit", self.timeline.now, unit.rid, unit.tokens, unit.hashes))
        sched = self.scheduler
        job = Job(rid=unit.rid, prompt_lens=[unit.tokens], keys=[unit.hashes],
                  arrived=unit.arrival if arrived is None else arrived)
        self._units[unit.rid] = unit
        if not sched.queue:
            placement = sched.try_place(job)
            if placement is not None:
                self._on_placed(placement)
                self._after()
                return True
        if len(sched.queue) >= self.cfg.queue_size:
            del self._units[unit.rid]
            sched.stats.rejected_queue_full += 1
            self.rejected += 1
            return False
        job.future = _Future(self._on_placed)
        sched.queue.append(job)
        sched.stats.queued += 1
        sched.pump()
        self._after()
        return True

    def submit_offline(self, units: Iterator[SimUnit]) -> None:
        """Every unit arrives at t=0 (see the module docstring)."""
        for unit in units:
            self.submit(unit)
            if len(self.scheduler.queue) >= OFFLINE_WINDOW:
                break
        self._backlog = units
        self._after()

    def finished(self, units: list[SimUnit]) -> None:
        """One engine step's answers: each released, then one pump. The router's releases of one SGLang batch
        arrive together and its ``pump_soon`` pumps once after them (one event-loop turn); a pump per release
        would give the room to the queue's head one request at a time, which the router no longer does."""
        sched, trace = self.scheduler, self.trace
        for unit in units:
            if trace is not None:
                trace.append(("release", self.timeline.now, unit.rid))
            sched.release(unit.placement, ok=True)
        if self._pump_due:
            self._pump_due = False
            if trace is not None:
                trace.append(("pump", self.timeline.now))
            sched.pump()
        self._after()

    def _pump_soon(self) -> None:
        """``Scheduler.pump_soon``: a release asks for a pump; ``finished`` makes it after the step's releases."""
        self._pump_due = True

    def pump_if_due(self) -> None:
        """Pump now if something asked for one (another replica's load went down: ``replica_frontends``)."""
        if self._pump_due:
            self._pump_due = False
            self.scheduler.pump()
            self._after()

    def pump(self, _: object = None) -> None:
        """What the router's ``on_change`` does (KV events stored blocks, a hold ran out)."""
        if self.trace is not None and _ is not None:
            self.trace.append(("pump", self.timeline.now))
        self.scheduler.pump()
        self._after()

    def kv_events(self, engine: Engine, removed: list[int], stored: list[int]) -> None:
        self.timeline.at(self.timeline.now + self.event_delay_s, self._deliver, (engine.id, removed, stored))

    def expire_promises(self) -> None:
        """The router's health loop: completed promises past their TTL are dropped."""
        if self.trace is not None:
            self.trace.append(("expire", self.timeline.now))
        self.ledger.expire(now=self.timeline.now)

    # -- internals ---------------------------------------------------------------------------
    def _deliver(self, arg: tuple[str, list[int], list[int]]) -> None:
        wid, removed, stored = arg
        if self.trace is not None:
            self.trace.append(("events", self.timeline.now, wid, removed, stored))
        events = []
        if removed:
            events.append(BlockRemoved(block_hashes=removed))
        if stored:
            events.append(BlockStored(block_hashes=stored, parent_block_hash=None, block_size=self.page))
        self.pool.events.on_batch(self.sources[wid], EventBatch(seq=next(self._seq), ts=self.timeline.now,
                                                               events=events, dp_rank=0))

    def _after(self) -> None:
        """After the scheduler ran: dispatch its placements, arm hold timers, refill the offline queue."""
        self._flush()
        sched = self.scheduler
        if sched.new_holds:
            # The router arms a timer (call_later) for each new hold; the virtual clock does it here, for the
            # jobs still queued (the timers are alike: their order among themselves does not matter).
            held, sched.new_holds = sched.new_holds, []
            for job in held:
                if job.future is not None and not job.future.done() and job.rid not in self._timed:
                    self._timed.add(job.rid)
                    self.timeline.at(job.arrived + self.cfg.prefix_wait_s + 1e-3, self.pump, "timer")
        if self._backlog is not None:
            self._top_up()

    def _top_up(self) -> None:
        queue, backlog = self.scheduler.queue, self._backlog
        while len(queue) < OFFLINE_WINDOW:
            unit = next(backlog, None)
            if unit is None:
                self._backlog = None
                return
            if self.trace is not None:
                self.trace.append(("queued", self.timeline.now, unit.rid, unit.tokens, unit.hashes))
            job = Job(rid=unit.rid, prompt_lens=[unit.tokens], keys=[unit.hashes], arrived=unit.arrival)
            job.future = _Future(self._on_placed)
            self._units[unit.rid] = unit
            queue.append(job)
            self.scheduler.stats.queued += 1

    def _on_placed(self, placement: Placement) -> None:
        """Right after the reservation: note the worker's in-flight FLOPs before it; dispatch after the pump."""
        before = placement.worker.inflight_flops - placement.cost
        if before > self.max_inflight_before:
            self.max_inflight_before = before
        if self.on_placed is not None:
            self.on_placed(placement)
        self._placed.append(placement)

    def _flush(self) -> None:
        while self._placed:
            placed, self._placed = self._placed, []
            for placement in placed:
                unit = self._units.pop(placement.job.rid)
                unit.placement = placement
                if self.dispatch is None:
                    self.engines[placement.worker.id].submit(unit)
                else:
                    self.dispatch(self.engines[placement.worker.id], unit)
