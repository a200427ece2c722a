"""Holds for promised blocks: whether a request waits for a prefix another request is still computing on
its worker, recomputes it in the same batch, or spills elsewhere (``RouterConfig.prefix_wait_s``; off by
default since the CPU policy matrix measured holds costing throughput in bulk and near capacity).

SGLang computes a shared prefix once per request when several requests holding it arrive together (its
radix cache learns the prefix only after a prefill). A request whose matched prefix is still being computed
for another request on the same worker can wait for the BlockStored events (each re-scores the queue) and
then reuse the blocks, as seed 000 §7.2's in-batch siblings do. Bounded by ``prefix_wait_s``; a failed
promise ends the wait at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sgl_moe.router.candidates import Candidate, job_cost
from sgl_moe.router.job import Job
from sgl_moe.router.worker import PINNED_THETA_SOURCE, Worker

if TYPE_CHECKING:
    from sgl_moe.router.scheduler import Scheduler

log = logging.getLogger("sgl_moe.router.decisions")

MEASURED_THETA_STATES = frozenset({"calibrated", "manual"})
"""Saturation states whose Θ marks where throughput stops growing (profiled, or set by the operator)."""


def theta_is_measured(w: Worker) -> bool:
    """Whether ``w``'s Θ is a measurement (or pinned by the router's --saturation-flops), not a placeholder."""
    return w.theta_source == PINNED_THETA_SOURCE or w.info.saturation.state in MEASURED_THETA_STATES


class PrefixHold:
    """The hold rule of one scheduler (its config, block index, pool, policy, clock and queue)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.sched = scheduler

    def check(self, job: Job, c: Candidate) -> Candidate | None:
        """None if ``job`` should wait for blocks ``c`` only has promised; else the candidate to reserve.

        The wait is taken only when it pays: a worker below Θ even after computing the promised blocks
        again (the duplicate) runs it in the same batch at no cost in throughput (Θ is where throughput
        stops growing with more work), so the request goes now, its reservation the duplicate's full cost;
        only when the duplicate would push the worker past Θ does the request wait for the blocks. That
        room is known only for a measured (or pinned) Θ: under the placeholder Θ of a worker that did not
        profile (one 4,096-token step, far above a CPU worker's knee) the request always waits.
        """
        sched = self.sched
        cfg = sched.cfg
        if cfg.policy != "longest_block_match" or cfg.prefix_wait_s <= 0 or not job.keys or not c.matched_blocks:
            return c
        committed = sched.index.committed_prefix(c.slot, job.keys[0][:c.matched_blocks])
        promised_tokens = (c.matched_blocks - committed) * c.worker.page_size
        if promised_tokens < max(cfg.prefix_wait_min_tokens, 1):
            return c
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
                return Candidate(w, c.slot, c.dp_rank, c.matched_blocks, (dup_cached,), dup_cost)
        spill = self.spill_instead(job, c)
        if spill is not None:
            return spill
        waited = sched.clock() - job.arrived
        if waited >= cfg.prefix_wait_s:
            return c
        if not job.held:
            job.held = True
            sched.stats.prefix_waits += 1
            try:  # re-score when the wait runs out even if nothing else happens meanwhile
                asyncio.get_running_loop().call_later(cfg.prefix_wait_s - waited + 1e-3, sched.pump)
            except RuntimeError:  # no event loop (simulator, unit tests drive pump themselves)
                pass
        job.waiting_for, job.waiting_cost = c.worker.id, c.cost
        if log.isEnabledFor(logging.DEBUG):
            log.debug("hold %s for %s: %d of %d matched blocks are still being computed there and computing them "
                      "again would pass Θ (in-flight %.3g of %.3g)", job.rid, c.worker.id,
                      c.matched_blocks - committed, c.matched_blocks, w.inflight_flops, w.theta)
        return None

    def spill_instead(self, job: Job, c: Candidate) -> Candidate | None:
        """Where a job about to be held for ``c``'s promised blocks goes instead, if anywhere: the worker with room
        (another than ``c``'s) where recomputing the prompt finishes first, when that beats waiting behind the
        holder's work by more than the recomputation (``PlacementPolicy``'s spill rule, applied to a hold). A hold
        that ignored idle workers kept a hot prefix's followers waiting on one saturated worker while the others
        idled (offline bulk, Zipf prefixes that fit the pools: 0.36x cache_aware, 0.49x round robin). In the
        pump's first pass the spill is deferred (the scheduler's ``last_deferred``): room goes first to jobs that
        recompute nothing."""
        sched = self.sched
        if not sched.cfg.hold_spills or len(job.prompt_lens) != 1:
            return None
        holder = c.worker
        best: tuple[float, Worker, float] | None = None
        for w in sched.pool.routable(job.exclude):
            if w is holder or not w.admissible:
                continue
            cost = job_cost(w, job, [0])
            if best is None or w.inflight_flops + cost < best[0]:
                best = (w.inflight_flops + cost, w, cost)
        if best is None:
            return None
        spill_finish, w, cost = best
        extra = max(0.0, cost - c.cost)
        wait_finish = holder.inflight_flops + sched.queued_cost_before(job, holder) + c.cost
        if spill_finish + extra >= wait_finish:
            return None
        if sched.policy.defer_spills:
            sched.last_deferred = True
            return None
        rank, slot = min(w.slots.items())
        return Candidate(w, slot, rank, 0, (0,), cost)
