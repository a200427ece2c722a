"""Where the router's spill test flips for a job waiting for a saturated worker, learned from its own policy.

The memo (``memo``, rule 5) vouches for a waiting job only while no worker without a match gets light
enough for a spill there to pay. ``PlacementPolicy.longest_block_match`` spills when the spill "finishes
sooner": ``alt_load + alt_cost + k * max(0, alt_cost - best_cost) < wait_finish``, with ``k`` 0 (finish
sooner) or 1 (sooner by more than the recomputation it adds). Which ``k`` the router applies is asked
of the router itself: ``spill_penalty`` places a probe job between two probe workers on both sides of
each candidate threshold and returns the ``k`` whose threshold the policy follows exactly, or None (then
the memo gives such jobs no certificate and scores them every time).
"""

from __future__ import annotations

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.candidates import Candidate
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.policy import DEFERRED, PlacementPolicy
from sgl_moe.router.placement.scheduler import SchedulerStats
from sgl_moe.wire import WorkerInfo

PENALTIES = (0, 1)
"""Multiples of the recomputed FLOPs a spill must beat waiting by (old rule, current rule)."""


def spill_penalty(cfg: RouterConfig, info: WorkerInfo) -> int | None:
    """The ``k`` of the module docstring that the router's policy applies, or None if neither fits."""
    index = BlockIndex()
    pool = WorkerPool.without_http(cfg, index, PendingLedger(index, ttl_s=cfg.pending_ttl_s), lambda: None)
    best_w = pool.admit("probe://a", info, worker_id="a")
    alt_w = pool.admit("probe://b", info, worker_id="b")
    theta = best_w.theta
    if not 0 < theta < float("inf"):
        return None
    best_cost, alt_cost = 0.1 * theta, 0.3 * theta
    policy = PlacementPolicy(cfg, lambda: 0.0, SchedulerStats(), lambda job, worker: 0.0)
    policy.defer_spills = True  # a spill is only reported (deferred), never counted

    def spills(alt_load: float) -> bool:
        best_w.inflight_flops, alt_w.inflight_flops = theta, alt_load
        (b_rank, b_slot), = best_w.slots.items()
        (a_rank, a_slot), = alt_w.slots.items()
        best = Candidate(best_w, b_slot, b_rank, 1, (info.page_size,), best_cost)
        alt = Candidate(alt_w, a_slot, a_rank, 0, (0,), alt_cost)
        job = Job(rid="probe", prompt_lens=[4 * info.page_size], keys=[[1, 2, 3]], arrived=0.0)
        choice, reason = policy.longest_block_match(job, [best, alt], [alt])
        return choice is not None or reason.startswith(DEFERRED)

    wait_finish = theta + best_cost
    for k in PENALTIES:
        threshold = wait_finish - alt_cost - k * (alt_cost - best_cost)
        if spills(threshold - 0.01 * theta) and not spills(threshold + 0.01 * theta):
            return k
    return None
