"""Placement and admission: which worker runs a request, and when.

- **Cost** (seed 000 Eq. 2): FLOPs of the prompt tokens a worker must still compute after the prefix
  it holds (committed or pending blocks), attention counted for causal masks, plus the expected
  decode FLOPs when more than one token is generated.
- **Admission**: a worker whose in-flight FLOPs are at or above its Θ is given nothing more. The
  reservation (in-flight += cost) is made in the same synchronous step as the choice, so concurrent
  dispatches cannot overshoot; it is released, in the same unit, when the request ends.
- **Queue**: requests no worker can take wait in one global FIFO queue and are re-scored whenever
  capacity appears. A request waiting for its saturated best-matching worker does not block the
  requests behind it (no head-of-line blocking).
- **Policies**: ``longest_block_match`` (default), ``round_robin``, ``least_flops``; all share the above.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field

from sgl_moe.flops import FlopsModel
from sgl_moe.router.block_index import BlockIndex
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.pending import PendingLedger, Promise
from sgl_moe.router.workers import Worker, WorkerPool

log = logging.getLogger("sgl_moe.router.decisions")

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


@dataclass(eq=False)
class Job:
    """One unit of placement: a request (all its prompts go to one worker)."""

    rid: str
    prompt_lens: list[int]
    keys: list[list[int]]
    """Block hashes of each prompt; empty lists when the request is routed without affinity."""
    shared_prefix_len: int = 0
    max_new_tokens: int = 1
    exclude: frozenset[str] = frozenset()
    """Workers not to use (one that already failed this request)."""
    arrived: float = field(default_factory=time.monotonic)
    future: asyncio.Future | None = None
    waiting_for: str | None = None
    """The saturated worker this queued job chose to wait for, and its cost there."""
    waiting_cost: float = 0.0


@dataclass(eq=False)
class Placement:
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


@dataclass(slots=True)
class Candidate:
    worker: Worker
    slot: int
    dp_rank: int
    matched_blocks: int
    cached_tokens: tuple[int, ...]
    cost: float

    @property
    def load(self) -> float:
        return self.worker.inflight_flops / self.worker.theta


@dataclass
class SchedulerStats:
    dispatched: int = 0
    queued: int = 0
    rejected_queue_full: int = 0
    queue_timeouts: int = 0
    spills: int = 0
    decision_seconds: list[float] = field(default_factory=list)


def job_cost(worker: Worker, job: Job, cached: list[int] | tuple[int, ...]) -> float:
    """FLOPs the worker spends on the job given the cached prefix of each prompt (Eq. 2, causal).

    Prompts of one request that share a prefix (``/v1/score`` items after their query) compute it once.
    """
    f = worker.flops
    total = 0.0
    shared = job.shared_prefix_len
    for i, (n, c) in enumerate(zip(job.prompt_lens, cached)):
        if i > 0 and shared:
            c = max(c, min(shared, n - 1))
        total += f.request_flops(c, n - c)
        extra = job.max_new_tokens - 1
        if extra > 0:  # decode: each further token is one position attending to the whole context
            total += extra * (f.linear_flops_per_token + f.lm_head_flops_per_token)
            total += f.attn_flops_per_pair * (extra * n + extra * (extra + 1) / 2)
    return total


class Scheduler:
    def __init__(self, cfg: RouterConfig, pool: WorkerPool, index: BlockIndex, ledger: PendingLedger) -> None:
        self.cfg = cfg
        self.pool = pool
        self.index = index
        self.ledger = ledger
        self.queue: deque[Job] = deque()
        self.stats = SchedulerStats()
        self._rr = itertools.count()
        self._decision_window: deque[float] = deque(maxlen=4096)
        self.queue_wait: deque[float] = deque(maxlen=4096)

    # -- public ------------------------------------------------------------------------------
    async def acquire(self, job: Job) -> Placement:
        """A placement with its reservation made; waits in the FIFO queue when no worker has room."""
        if not self.pool.routable(job.exclude):
            raise NoWorkers("no healthy worker is available" if self.pool.workers else "no worker is registered")
        if not self.queue:
            placement = self._try_place(job)
            if placement is not None:
                return placement
        if len(self.queue) >= self.cfg.queue_size:
            self.stats.rejected_queue_full += 1
            retry = self._retry_after()
            log.warning("rejecting %s: admission queue full (%d waiting); Retry-After %d s",
                        job.rid, len(self.queue), retry)
            raise QueueFull(len(self.queue), retry)
        job.future = asyncio.get_running_loop().create_future()
        self.queue.append(job)
        self.stats.queued += 1
        self.pump()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), self.cfg.queue_timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if job.future.done() and not job.future.cancelled():
                # Placed in the same instant it timed out or the client left: give the reservation back.
                self.release(job.future.result(), ok=False)
            else:
                job.future.cancel()
                self._drop(job)
            if isinstance(exc, asyncio.CancelledError):
                raise
            self.stats.queue_timeouts += 1
            raise QueueTimeout(f"no worker admitted the request within {self.cfg.queue_timeout_s:.0f} s") from None

    def release(self, placement: Placement, *, ok: bool) -> None:
        """The request ended: give back its reservation and settle its pending blocks."""
        if placement.released:
            return
        placement.released = True
        worker = placement.worker
        worker.inflight_requests -= 1
        # The same number that was added at dispatch; exactly zero when idle (no float residue).
        worker.inflight_flops = worker.inflight_flops - placement.cost if worker.inflight_requests else 0.0
        if placement.promise is not None:
            if ok:
                self.ledger.complete(placement.promise)
            else:
                self.ledger.fail(placement.promise)
        self.pump()

    def pump(self) -> None:
        """Place queued requests, in FIFO order, while some worker has room."""
        scanned = 0
        for job in list(self.queue):
            if job.future is None or job.future.done():
                self._drop(job)
                continue
            if not self.pool.routable(job.exclude):
                job.future.set_exception(NoWorkers("no healthy worker is available"))
                self._drop(job)
                continue
            if not any(w.admissible for w in self.pool.workers.values()) or scanned >= PUMP_SCAN_LIMIT:
                break
            scanned += 1
            placement = self._try_place(job)
            if placement is not None:
                job.future.set_result(placement)
                self._drop(job)

    def decision_times(self) -> list[float]:
        return list(self._decision_window)

    # -- placement ---------------------------------------------------------------------------
    def _candidates(self, job: Job, workers: list[Worker]) -> list[Candidate]:
        mask = 0
        for w in workers:
            for slot in w.slots.values():
                mask |= 1 << slot
        n_prompts = len(job.prompt_lens)
        matches = [self.index.match(keys, mask) for keys in job.keys if keys]
        matches += [{}] * (n_prompts - len(matches))
        first = matches[0] if matches else {}
        matched_slots = set().union(*matches) if n_prompts > 1 else set(first)
        zero = (0,) * n_prompts
        zero_cost: dict[FlopsModel, float] = {}
        costs: dict[tuple, float] = {}  # workers with the same model and the same hits cost the same
        out = []
        for w in workers:
            slots = w.slots
            if len(slots) == 1:
                (rank, slot), = slots.items()
            else:  # the attention-DP rank holding the longest prefix of the first prompt takes the request
                rank, slot = max(slots.items(), key=lambda rs: (first.get(rs[1], 0), -rs[0]))
            if slot not in matched_slots:
                cost = zero_cost.get(w.flops)
                if cost is None:
                    cost = zero_cost[w.flops] = job_cost(w, job, list(zero))
                out.append(Candidate(w, slot, rank, 0, zero, cost))
                continue
            page = w.page_size
            # SGLang recomputes at least the last prompt token (it needs its logits).
            cached = tuple(min(m.get(slot, 0) * page, ((n - 1) // page) * page)
                           for n, m in zip(job.prompt_lens, matches))
            key = (w.flops, cached)
            cost = costs.get(key)
            if cost is None:
                cost = costs[key] = job_cost(w, job, list(cached))
            out.append(Candidate(w, slot, rank, first.get(slot, 0), cached, cost))
        return out

    def _try_place(self, job: Job) -> Placement | None:
        t0 = time.perf_counter()
        workers = self.pool.routable(job.exclude)
        cands = self._candidates(job, workers)
        admissible = [c for c in cands if c.worker.admissible]
        if not admissible:
            return None
        policy = self.cfg.policy
        job.waiting_for = None
        if policy == "round_robin":
            choice = admissible[next(self._rr) % len(admissible)]
            reason = "round robin"
        elif policy == "least_flops":
            choice = min(admissible, key=lambda c: (c.load, c.worker.id))
            reason = "least in-flight FLOPs / Θ"
        else:
            choice, reason = self._longest_block_match(job, cands, admissible)
            if choice is None:
                self._note_decision(t0)
                return None
        if log.isEnabledFor(logging.DEBUG):
            reason += "; matched blocks per candidate: " + ", ".join(
                f"{c.worker.id}={c.matched_blocks}{'' if c.worker.admissible else ' (saturated)'}" for c in cands)
        return self._reserve(job, choice, reason, t0)

    def _longest_block_match(self, job: Job, cands: list[Candidate],
                             admissible: list[Candidate]) -> tuple[Candidate | None, str]:
        def rank(c: Candidate) -> tuple:
            return (c.matched_blocks, -c.load, c.worker.id)

        best = max(cands, key=rank)
        if best.matched_blocks == 0:
            choice = min(admissible, key=lambda c: ((c.worker.inflight_flops + c.cost) / c.worker.theta, c.worker.id))
            return choice, "no prefix match anywhere: least loaded after this request"
        if best.worker.admissible:
            return best, f"longest prefix match ({best.matched_blocks} blocks)"
        alt = max(admissible, key=rank)
        # Best worker is saturated. Wait for it, or recompute the prefix on a worker with room?
        # Both finish after the work ahead of them plus their own cost (equal-speed workers).
        ahead = best.worker.inflight_flops + self._queued_cost_before(job, best.worker)
        wait_finish = ahead + best.cost
        spill_finish = alt.worker.inflight_flops + alt.cost
        waited = time.monotonic() - job.arrived
        if spill_finish < wait_finish:
            self.stats.spills += 1
            return alt, (f"spill: best {best.worker.id} ({best.matched_blocks} blocks) is saturated; recomputing "
                         f"{alt.cost - best.cost:.3g} extra FLOPs here beats waiting behind {ahead:.3g}")
        if waited >= self.cfg.max_affinity_wait_s:
            self.stats.spills += 1
            return alt, f"spill: waited {waited:.1f} s for saturated {best.worker.id}"
        job.waiting_for, job.waiting_cost = best.worker.id, best.cost
        return None, f"waiting for {best.worker.id} ({best.matched_blocks} blocks)"

    def _queued_cost_before(self, job: Job, worker: Worker) -> float:
        """FLOPs of the requests ahead in the queue that also wait for ``worker``."""
        ahead = 0.0
        for other in self.queue:
            if other is job:
                break
            if other.waiting_for == worker.id:
                ahead += other.waiting_cost
        return ahead

    def _reserve(self, job: Job, c: Candidate, reason: str, t0: float) -> Placement:
        w = c.worker
        before = w.inflight_flops
        w.inflight_flops += c.cost
        w.inflight_requests += 1
        w.peak_inflight_requests = max(w.peak_inflight_requests, w.inflight_requests)
        w.counters.requests += 1
        # Promise the blocks the target does not already hold: the matched prefix is there (committed or
        # promised by an earlier request) and stays counted through that request's promise.
        keys = job.keys[0][c.matched_blocks:] if len(job.keys) == 1 else list(
            dict.fromkeys(k for ks in job.keys for k in ks))
        promise = self.ledger.promise(job.rid, c.slot, keys) if keys else None
        decision = self._note_decision(t0)
        queued = time.monotonic() - job.arrived
        self.stats.dispatched += 1
        if job.future is not None:
            self.queue_wait.append(queued)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("route %s -> %s rank %d: %s; cost %.3g FLOPs, in-flight %.3g -> %.3g of Θ %.3g; "
                      "predicted cached %d tokens; queued %.3f s; decision %.1f us",
                      job.rid, w.id, c.dp_rank, reason, c.cost, before, w.inflight_flops, w.theta,
                      sum(c.cached_tokens), queued, decision * 1e6)
        return Placement(job=job, worker=w, slot=c.slot, dp_rank=c.dp_rank, cost=c.cost,
                         predicted_cached_tokens=sum(c.cached_tokens), matched_blocks=c.matched_blocks,
                         reason=reason, queued_s=queued, decision_s=decision, promise=promise)

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
