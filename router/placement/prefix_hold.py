"""Holds for promised blocks: whether a request waits for a prefix another request is still computing on
its worker, recomputes it in the same batch, or spills elsewhere (``RouterConfig.prefix_wait_s``, 1 s by default:
SGLang's overlap scheduler admits a worker's next step before the previous one's prefixes enter its cache).

SGLang computes a shared prefix once per request when several requests holding it arrive together (its
radix cache learns the prefix only after a prefill). A request whose matched prefix is still being computed
for another request on the same worker can wait for the BlockStored events (each re-scores the queue) and
then reuse the blocks, as seed 000 §7.2's in-batch siblings do. Bounded by ``prefix_wait_s``; a failed
promise ends the wait at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sgl_moe.router.membership.worker import PINNED_THETA_SOURCE, Worker
from sgl_moe.router.placement.candidates import Candidate, job_cost
from sgl_moe.router.placement.job import Job

log = logging.getLogger("sgl_moe.router.decisions")

MEASURED_THETA_STATES = frozenset({"calibrated", "manual"})
"""Saturation states whose Θ marks where throughput stops growing (profiled, or set by the operator)."""


def theta_is_measured(w: Worker) -> bool:
    """Whether ``w``'s Θ is a measurement (or pinned by the router's --saturation-flops), not a placeholder."""
    return w.theta_source == PINNED_THETA_SOURCE or w.info.saturation.state in MEASURED_THETA_STATES


class HoldVerdict:
    """What ``PrefixHold.check`` decided for one job and its chosen candidate. (A plain class: one is made per
    placement, and a ``NamedTuple``'s ``__new__`` is interpreted Python even where this module is compiled.)"""

    __slots__ = ("candidate", "spill_deferred", "rescore_in")

    def __init__(self, candidate: Candidate | None, spill_deferred: bool = False,
                 rescore_in: float | None = None) -> None:
        self.candidate = candidate
        """What to reserve: the candidate itself, its worker at the duplicate's cost, or a spill; None: the job
        waits."""
        self.spill_deferred = spill_deferred
        """A spill would have beaten the wait, but spills were deferred (the pump's first pass)."""
        self.rescore_in = rescore_in
        """The job began to wait just now: re-score it after this many seconds even if nothing else happens."""

    def __repr__(self) -> str:
        return f"HoldVerdict({self.candidate!r}, {self.spill_deferred!r}, {self.rescore_in!r})"


class PrefixHold:
    """The hold rule of one scheduler: given the values and the views of its tables it needs, it decides; the
    scheduler acts on the verdict (its counters, its ``last_deferred``, the timer that re-scores a hold)."""

    def __init__(self, *, enabled: bool, wait_s: float, min_tokens: int, spills: bool,
                 committed_prefix: Callable[[int, Sequence[int]], int],
                 routable: Callable[[frozenset[str]], list[Worker]],
                 queued_cost_before: Callable[[Job, Worker], float], clock: Callable[[], float]) -> None:
        self.enabled = enabled
        """Holds are taken at all: the ``longest_block_match`` policy with ``prefix_wait_s`` > 0."""
        self.wait_s = wait_s
        """``RouterConfig.prefix_wait_s``: the longest a job waits for promised blocks."""
        self.min_tokens = max(min_tokens, 1)
        """``RouterConfig.prefix_wait_min_tokens`` (at least one): fewer promised tokens are recomputed, not
        waited for."""
        self.spills = spills
        """``RouterConfig.hold_spills``: a job about to be held may spill to a worker with room instead."""
        self.committed_prefix = committed_prefix
        """``BlockIndex.committed_prefix``: leading blocks a slot holds committed (not only promised)."""
        self.routable = routable
        """``WorkerPool.routable``: the workers in rotation, less those excluded."""
        self.queued_cost_before = queued_cost_before
        """``Scheduler.queued_cost_before``: FLOPs of the queued jobs ahead that also wait for a worker."""
        self.clock = clock
        """The scheduler's clock (how long a job has waited)."""

    def check(self, job: Job, c: Candidate, defer_spills: bool) -> HoldVerdict:
        """Whether ``job`` should wait for blocks ``c`` only has promised (the verdict's candidate None); else the
        candidate to reserve. ``defer_spills``: the pump's first pass (``PlacementPolicy.defer_spills``).

        The wait is taken only when it pays: a worker below Θ even after computing the promised blocks
        again (the duplicate) runs it in the same batch at no cost in throughput (Θ is where throughput
        stops growing with more work), so the request goes now, its reservation the duplicate's full cost;
        only when the duplicate would push the worker past Θ does the request wait for the blocks. That
        room is known only for a measured (or pinned) Θ: under the placeholder Θ of a worker that did not
        profile (one 4,096-token step, far above a CPU worker's knee) the request always waits. A worker
        that publishes no KV events (``Worker.reports_stored``) is never waited for.
        """
        if not self.enabled or not job.keys or not c.matched_blocks or not c.worker.reports_stored:
            return HoldVerdict(c)
        committed = self.committed_prefix(c.slot, job.keys[0][:c.matched_blocks])
        promised_tokens = (c.matched_blocks - committed) * c.worker.page_size
        if promised_tokens < self.min_tokens:
            return HoldVerdict(c)
        w = c.worker
        if len(job.prompt_lens) == 1 and theta_is_measured(w):
            n = job.prompt_lens[0]
            dup_cached = min(committed * w.page_size, ((n - 1) // w.page_size) * w.page_size)
            dup_cost = job_cost(w, job, [dup_cached])
            if w.inflight_flops + dup_cost <= w.theta:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("no hold for %s on %s: %d promised tokens recomputed in the same batch; in-flight "
                              "%.3g + %.3g <= Θ %.3g", job.rid, w.id, promised_tokens, w.inflight_flops, dup_cost,
                              w.theta)
                return HoldVerdict(Candidate(w, c.slot, c.dp_rank, c.matched_blocks, (dup_cached,), dup_cost))
        spill = self.spill_instead(job, c)
        deferred = False
        if spill is not None:
            if not defer_spills:
                return HoldVerdict(spill)
            deferred = True
        waited = self.clock() - job.arrived
        if waited >= self.wait_s:
            return HoldVerdict(c, deferred)
        rescore_in = None
        if not job.held:
            job.held = True
            rescore_in = self.wait_s - waited + 1e-3
        job.waiting_for, job.waiting_cost = c.worker.id, c.cost
        if log.isEnabledFor(logging.DEBUG):
            log.debug("hold %s for %s: %d of %d matched blocks are still being computed there and computing them "
                      "again would pass Θ (in-flight %.3g of %.3g)", job.rid, c.worker.id,
                      c.matched_blocks - committed, c.matched_blocks, w.inflight_flops, w.theta)
        return HoldVerdict(None, deferred, rescore_in)

    def spill_instead(self, job: Job, c: Candidate) -> Candidate | None:
        """Where a job about to be held for ``c``'s promised blocks goes instead, if anywhere: the worker with room
        (another than ``c``'s) where recomputing the prompt finishes first, when that beats waiting behind the
        holder's work by more than the recomputation (``PlacementPolicy``'s spill rule, applied to a hold). A hold
        that ignored idle workers kept a hot prefix's followers waiting on one saturated worker while the others
        idled (offline bulk, Zipf prefixes that fit the pools: 0.36x cache_aware, 0.49x round robin). In the
        pump's first pass ``check`` defers the spill (``HoldVerdict.spill_deferred``): room goes first to jobs that
        recompute nothing."""
        if not self.spills or len(job.prompt_lens) != 1:
            return None
        holder = c.worker
        best: tuple[float, Worker, float] | None = None
        for w in self.routable(job.exclude):
            if w is holder or not w.admissible:
                continue
            cost = job_cost(w, job, [0])
            if best is None or w.inflight_flops + cost < best[0]:
                best = (w.inflight_flops + cost, w, cost)
        if best is None:
            return None
        spill_finish, w, cost = best
        extra = max(0.0, cost - c.cost)
        wait_finish = holder.inflight_flops + self.queued_cost_before(job, holder) + c.cost
        if spill_finish + extra >= wait_finish:
            return None
        rank, slot = min(w.slots.items())
        return Candidate(w, slot, rank, 0, (0,), cost)
