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
- **Scale**: with one Θ and one FLOPs model for all workers (``LoadOrder.uniform``), a decision scores
  the workers holding a prefix of the request plus the least-loaded admissible rest, found in a view
  sorted by in-flight FLOPs; otherwise (and for debug logs, which list every worker) every worker is
  scored. Both paths choose the same worker.
- **Time** comes from ``clock`` (``time.monotonic`` by default), so a simulator can drive the scheduler
  on a virtual clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sgl_moe.flops import FlopsModel
from sgl_moe.router.block_index import BlockIndex
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.load_order import LoadOrder
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
    held: bool = False
    """Waited (or waits) for promised prefix blocks to be stored (see Scheduler._hold_for_prefix)."""


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
    prefix_waits: int = 0
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
        self._rr = itertools.count()
        self._decision_window: deque[float] = deque(maxlen=4096)
        self.queue_wait: deque[float] = deque(maxlen=4096)
        self.scan_all = False
        """Score every worker on every decision (the reference path; debug logging also takes it)."""
        self._view: LoadOrder | None = None
        self._ahead: dict[str, float] | None = None
        """During a pump: FLOPs of the jobs already passed that wait for each worker (see _queued_cost_before)."""

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
        before = worker.inflight_flops
        # The same number that was added at dispatch; exactly zero when idle (no float residue).
        worker.inflight_flops = worker.inflight_flops - placement.cost if worker.inflight_requests else 0.0
        if self._view is not None:
            self._view.moved(worker, before)
        if placement.promise is not None:
            if ok:
                self.ledger.complete(placement.promise, now=self.clock())
            else:
                self.ledger.fail(placement.promise)
        self.pump()

    def pump(self) -> None:
        """Place queued requests, in FIFO order, while some worker has room.

        Nothing here awaits, so the queue and the workers change only through this loop: whether any
        worker has room changes only when a job is placed, and the jobs before the current one are
        exactly those this loop kept, which lets it keep their waiting costs as running sums.
        """
        scanned = 0
        queue = self.queue
        room: bool | None = None  # whether some worker has room; computed when first needed
        outer, self._ahead = self._ahead, {}
        ahead = self._ahead
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
                    room = self._any_admissible()
                if not room or scanned >= PUMP_SCAN_LIMIT:
                    break
                scanned += 1
                placement = self._try_place(job)
                if placement is not None:
                    job.future.set_result(placement)
                    del queue[i]
                    room = None
                    continue
                if job.waiting_for is not None:
                    ahead[job.waiting_for] = ahead.get(job.waiting_for, 0.0) + job.waiting_cost
                i += 1
        finally:
            self._ahead = outer

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

    def _uniform_view(self, workers: list[Worker]) -> LoadOrder | None:
        """The load-ordered view of ``workers`` (rebuilt when the routable list changed), if uniform."""
        view = self._view
        if view is None or view.stale or view.key != tuple(workers):
            view = self._view = LoadOrder(workers)
        return view if view.uniform else None

    def _any_admissible(self) -> bool:
        view = None if self.scan_all else self._uniform_view(self.pool.routable())
        if view is not None:
            return view.any_admissible()
        return any(w.admissible for w in self.pool.workers.values())

    def _matched_candidates(self, job: Job, view: LoadOrder) -> tuple[list[Candidate], int]:
        """Candidates for the workers holding a prefix of some prompt, scored as ``_candidates`` scores
        them, and the slot mask of those workers (every other worker holds nothing of the job)."""
        n_prompts = len(job.prompt_lens)
        matches = [self.index.match(keys, view.mask) for keys in job.keys if keys]
        matches += [{}] * (n_prompts - len(matches))
        first = matches[0] if matches else {}
        matched_slots = set().union(*matches) if n_prompts > 1 else set(first)
        zero = (0,) * n_prompts
        owner = view.owner
        matched_workers = {owner[s].id: owner[s] for s in matched_slots}
        out = []
        skip = 0
        costs: dict[tuple, float] = {}
        for w in matched_workers.values():
            skip |= view.bits[w.id]
            slots = w.slots
            if len(slots) == 1:
                (rank, slot), = slots.items()
            else:
                rank, slot = max(slots.items(), key=lambda rs: (first.get(rs[1], 0), -rs[0]))
            if slot not in matched_slots:
                out.append(Candidate(w, slot, rank, 0, zero, job_cost(w, job, list(zero))))
                continue
            page = w.page_size
            cached = tuple(min(m.get(slot, 0) * page, ((n - 1) // page) * page)
                           for n, m in zip(job.prompt_lens, matches))
            cost = costs.get(cached)
            if cost is None:
                cost = costs[cached] = job_cost(w, job, list(cached))
            out.append(Candidate(w, slot, rank, first.get(slot, 0), cached, cost))
        return out, skip

    @staticmethod
    def _candidate_of(job: Job, w: Worker, groups: list[tuple[int, int]]) -> Candidate:
        """One single-slot worker scored for a one-prompt job, given the match as ``match_groups``."""
        (rank, slot), = w.slots.items()
        bit = 1 << slot
        blocks = next((b for b, mask in groups if mask & bit), 0)
        if not blocks:
            return Candidate(w, slot, rank, 0, (0,), job_cost(w, job, [0]))
        page, n = w.page_size, job.prompt_lens[0]
        cached = (min(blocks * page, ((n - 1) // page) * page),)
        return Candidate(w, slot, rank, blocks, cached, job_cost(w, job, list(cached)))

    def _place_in_view(self, job: Job, view: LoadOrder, workers: list[Worker], t0: float) -> Placement | None:
        """``_try_place`` without scoring every worker; chooses the same worker (and reason).

        One Θ and one FLOPs model for all: every worker holding nothing of the job costs the same, and
        each ordering the policies use (load; load after the job) is monotone in in-flight FLOPs, so
        the best of those workers is found in ``view``. Among the holders of a prefix, the policy's
        rank is (matched blocks, lower load, higher id): the longest group first, then load order.
        """
        if len(job.prompt_lens) != 1 or not view.single_slot:
            return self._place_among_matched(job, view, workers, t0)
        policy = self.cfg.policy
        keys = job.keys[0]
        groups = self.index.match_groups(keys, view.mask) if keys else []
        if policy == "round_robin":
            w = self._next_round_robin(job, workers)
            if w is None:
                return None
            return self._reserve(job, self._candidate_of(job, w, groups), "round robin", t0)
        if not view.any_admissible():
            return None
        job.waiting_for = None
        theta = view.theta
        if policy == "least_flops":
            w = view.least(lambda x: x / theta, highest_id=False)
            return self._reserve(job, self._candidate_of(job, w, groups), "least in-flight FLOPs / Θ", t0)
        if not groups:
            free = job_cost(workers[0], job, [0])
            w = view.least(lambda x: (x + free) / theta, highest_id=False)
            return self._reserve(job, self._candidate_of(job, w, groups),
                                 "no prefix match anywhere: least loaded after this request", t0)
        best = self._candidate_of(job, view.best_in(groups[0][1], admissible=False), groups)
        if best.worker.admissible:
            return self._reserve(job, best, f"longest prefix match ({best.matched_blocks} blocks)", t0)
        alt_w = None
        for _, mask in groups:
            alt_w = view.best_in(mask, admissible=True)
            if alt_w is not None:
                break
        else:
            matched = 0
            for _, mask in groups:
                matched |= mask
            alt_w = view.least(lambda x: x / theta, highest_id=True, skip=matched)
        alt = self._candidate_of(job, alt_w, groups)
        choice, reason = self._longest_block_match(job, [best, alt], [alt])
        if choice is None:
            self._note_decision(t0)
            return None
        return self._reserve(job, choice, reason, t0)

    def _next_round_robin(self, job: Job, workers: list[Worker]) -> Worker | None:
        """The next admissible worker in turn (None: all saturated, the job keeps waiting)."""
        room = [w for w in workers if w.admissible]
        if not room:
            return None
        job.waiting_for = None
        return room[next(self._rr) % len(room)]

    def _place_among_matched(self, job: Job, view: LoadOrder, workers: list[Worker],
                             t0: float) -> Placement | None:
        """The fast path for several prompts or DP ranks: every worker holding a prefix, scored, plus
        the least-loaded admissible other worker by each key the policy uses."""
        policy = self.cfg.policy
        if policy == "round_robin":
            w = self._next_round_robin(job, workers)
            if w is None:
                return None
            cands, _ = self._matched_candidates(job, view)
            zero = (0,) * len(job.prompt_lens)
            choice = next((c for c in cands if c.worker is w), None)
            if choice is None:
                rank, slot = min(w.slots.items())  # nothing matched: the lowest DP rank, as _candidates picks
                choice = Candidate(w, slot, rank, 0, zero, job_cost(w, job, list(zero)))
            return self._reserve(job, choice, "round robin", t0)
        cands, skip = self._matched_candidates(job, view)
        theta = view.theta
        zero = (0,) * len(job.prompt_lens)
        free = job_cost(workers[0], job, list(zero))
        reps = [view.least(lambda x: x / theta, highest_id=policy != "least_flops", skip=skip)]
        if policy != "least_flops":
            reps.append(view.least(lambda x: (x + free) / theta, highest_id=False, skip=skip))
        for w in dict.fromkeys(r for r in reps if r is not None):
            rank, slot = min(w.slots.items())  # nothing matched: the lowest DP rank, as _candidates picks
            cands.append(Candidate(w, slot, rank, 0, zero, free))
        return self._choose(job, cands, t0)

    def _try_place(self, job: Job) -> Placement | None:
        t0 = time.perf_counter()
        workers = self.pool.routable(job.exclude)
        if workers and not job.exclude and not self.scan_all and not log.isEnabledFor(logging.DEBUG):
            view = self._uniform_view(workers)
            if view is not None:
                return self._place_in_view(job, view, workers, t0)
        return self._choose(job, self._candidates(job, workers), t0)

    def _choose(self, job: Job, cands: list[Candidate], t0: float) -> Placement | None:
        """The policy's pick among scored candidates (both placement paths end here), then the reservation."""
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
        waited = self.clock() - job.arrived
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
        if self._ahead is not None:  # inside pump: the same sum, kept as the loop passes those jobs
            return self._ahead.get(worker.id, 0.0)
        ahead = 0.0
        for other in self.queue:
            if other is job:
                break
            if other.waiting_for == worker.id:
                ahead += other.waiting_cost
        return ahead

    def _hold_for_prefix(self, job: Job, c: Candidate) -> bool:
        """Whether ``job`` should wait for blocks ``c`` only has promised (in-batch prefix sharing).

        SGLang computes a shared prefix once per request when several requests holding it arrive
        together (its radix cache learns the prefix only after a prefill). A request whose matched
        prefix is still being computed for another request on the same worker therefore waits for the
        BlockStored events (each re-scores the queue) and then reuses the blocks, as seed 000 §7.2's
        in-batch siblings do. Bounded by ``prefix_wait_s``; a failed promise ends the wait at once.
        """
        cfg = self.cfg
        if cfg.policy != "longest_block_match" or cfg.prefix_wait_s <= 0 or not job.keys or not c.matched_blocks:
            return False
        committed = self.index.committed_prefix(c.slot, job.keys[0][:c.matched_blocks])
        if (c.matched_blocks - committed) * c.worker.page_size < max(cfg.prefix_wait_min_tokens, 1):
            return False
        waited = self.clock() - job.arrived
        if waited >= cfg.prefix_wait_s:
            return False
        if not job.held:
            job.held = True
            self.stats.prefix_waits += 1
            try:  # re-score when the wait runs out even if nothing else happens meanwhile
                asyncio.get_running_loop().call_later(cfg.prefix_wait_s - waited + 1e-3, self.pump)
            except RuntimeError:  # no event loop (simulator, unit tests drive pump themselves)
                pass
        job.waiting_for, job.waiting_cost = c.worker.id, c.cost
        if log.isEnabledFor(logging.DEBUG):
            log.debug("hold %s for %s: %d of %d matched blocks are still being computed there",
                      job.rid, c.worker.id, c.matched_blocks - committed, c.matched_blocks)
        return True

    def _reserve(self, job: Job, c: Candidate, reason: str, t0: float) -> Placement | None:
        if self._hold_for_prefix(job, c):
            self._note_decision(t0)
            return None
        w = c.worker
        before = w.inflight_flops
        w.inflight_flops += c.cost
        if self._view is not None:
            self._view.moved(w, before)
        w.inflight_requests += 1
        w.peak_inflight_requests = max(w.peak_inflight_requests, w.inflight_requests)
        w.counters.requests += 1
        # Promise the blocks the target does not already hold: the matched prefix is there (committed or
        # promised by an earlier request) and stays counted through that request's promise.
        keys = job.keys[0][c.matched_blocks:] if len(job.keys) == 1 else list(
            dict.fromkeys(k for ks in job.keys for k in ks))
        promise = self.ledger.promise(job.rid, c.slot, keys) if keys else None
        decision = self._note_decision(t0)
        queued = self.clock() - job.arrived
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
