"""A request's fixed cost (issue 18): measured by the worker's profile, counted by the router on every prompt.

On a CPU serving the shipped model a 32-token request took 5.7 ms and a 256-token one 12 ms at 8 in flight
(~4 ms of every request is HTTP, scheduling and a forward's fixed work), while their FLOPs differ 8x: a
router counting FLOPs alone sees a prefix-cache hit as nearly free and piles a hot prefix's requests on one
worker. These tests check the arithmetic, that the cost carries the overhead, and what that changes in
placement, on the real scheduler objects.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sgl_moe import saturation
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.candidates import job_cost
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.scheduler import Scheduler
from sgl_moe.wire import SaturationInfo
from tests.router.test_placement_rules import FLOPS, INFO, PAGE, Clock, Pool

FULL = FLOPS.request_flops(0, 256)
SHORT = FLOPS.request_flops(0, 32)


def test_overhead_is_the_fixed_time_in_flops_the_worker_could_have_computed():
    a, per_flop = 4e-3, 1e-9 / 3  # 4 ms fixed, 3 GFLOP/s
    long, short = (FULL, a + per_flop * FULL), (SHORT, a + per_flop * SHORT)
    assert saturation.request_overhead(long, short) == pytest.approx(a / per_flop)
    assert saturation.request_overhead((FULL, per_flop * FULL), (SHORT, per_flop * SHORT)) == pytest.approx(0.0,
                                                                                                          abs=1e-3)
    # Noise (the longer request was not slower) gives no figure rather than a negative or huge one.
    assert saturation.request_overhead((FULL, 0.010), (SHORT, 0.011)) is None
    assert saturation.request_overhead((SHORT, 0.010), (FULL, 0.011)) is None


def test_theta_and_rates_count_each_request_as_its_flops_plus_the_overhead():
    points = [(1, 1.0), (2, 1.0), (4, 1.0), (8, 2.0)]
    plain = saturation.from_throughput(points, FULL, 256, 1.0, 1.0)
    counted = saturation.from_throughput(points, FULL, 256, 1.0, 1.0, overhead_flops=FULL)
    assert plain.details["saturation_batch"] == counted.details["saturation_batch"] == 4  # the knee is unchanged
    assert counted.flops == pytest.approx(2 * plain.flops) and counted.details["request_overhead_flops"] == FULL
    assert counted.details["throughput_flops_per_s"] == pytest.approx([2 * r for r in
                                                                       plain.details["throughput_flops_per_s"]])
    assert "per request" in counted.source and plain.details["request_overhead_flops"] == 0.0


def _worker(overhead: float | None) -> Worker:
    info = replace(INFO, saturation=SaturationInfo(1e9, "profile", "calibrated", request_overhead_flops=overhead))
    return Worker.from_info("w", "http://w", info, pinned_theta=None)


def test_every_prompt_costs_its_flops_plus_the_workers_overhead():
    w, bare = _worker(FULL), _worker(None)
    assert bare.request_overhead_flops == 0.0 and w.request_overhead_flops == FULL
    hit = Job(rid="a", prompt_lens=[288], keys=[[1]])
    assert job_cost(bare, hit, [256]) == FLOPS.request_flops(256, 32)
    assert job_cost(w, hit, [256]) == pytest.approx(FLOPS.request_flops(256, 32) + FULL)
    three = Job(rid="b", prompt_lens=[40, 40, 40], keys=[[1], [2], [3]])
    assert job_cost(w, three, [0, 0, 0]) == pytest.approx(job_cost(bare, three, [0, 0, 0]) + 3 * FULL)
    assert w.describe(BlockIndex())["request_overhead_flops"] == FULL


def test_the_compiled_prefill_cost_is_the_flops_models_float_to_the_bit():
    """``candidates.prefill_cost`` writes ``FlopsModel.request_flops`` out (it runs compiled); placement compares
    costs, so it must be the same float, not a close one."""
    import random

    from sgl_moe.router.placement.candidates import prefill_cost

    rng = random.Random(7)
    for overhead in (None, FULL, 1234.5678):
        w = _worker(overhead)
        for cached, new in [(0, 0), (0, 1), (1, 0), (255, 1), *((rng.randrange(200_000), rng.randrange(1, 200_000))
                                                                 for _ in range(2000))]:
            assert prefill_cost(w, cached, new) == w.request_overhead_flops + w.flops.request_flops(cached, new)


def _hot_prefix_run(overhead: float, reports_stored: bool = True, **cfg) -> dict[str, int]:
    """16 requests sharing a 256-token prefix that w0 holds, offered at once to two workers whose Θ is the
    same 4 full requests of work in flight; returns where they went (placed now or left queued).
    ``reports_stored`` False: the workers publish no KV events."""
    index = BlockIndex()
    pool = Pool(index, 2, theta=4 * (FULL + overhead))
    for w in pool.workers.values():
        w.request_overhead_flops = overhead
        w.reports_stored = reports_stored
    sched = Scheduler(RouterConfig(**cfg), pool, index, PendingLedger(index, ttl_s=10), clock=Clock())
    prefix = list(range(1, 17))  # 16 blocks of 16 tokens
    index.store(pool.workers["w0"].slots[0], prefix)
    where = {"w0": 0, "w1": 0, "queued": 0}
    for i in range(16):
        placed = sched.try_place(Job(rid=f"r{i}", prompt_lens=[len(prefix) * PAGE + 32], keys=[[*prefix, 100 + i]]))
        where[placed.worker.id if placed else "queued"] += 1
    return where


def test_counting_the_overhead_stops_a_hot_prefix_from_piling_on_one_worker():
    # FLOPs alone: a hit (32 new tokens after 256 cached) costs ~1/9 of a full request, so the holder of the
    # prefix admits all 16 while the other worker idles.
    assert _hot_prefix_run(0.0) == {"w0": 16, "w1": 0, "queued": 0}
    # A fixed cost of one full request's FLOPs (the CPU's ratio): the holder fills at 7 hits; past that a hit
    # finishes sooner recomputing the prefix on the idle worker than queued behind the holder's work, so one
    # spills there, and without holds (--prefix-wait-s 0) the next ones follow it to the blocks it promised, and
    # the last ones wait (both at Θ).
    assert _hot_prefix_run(FULL, prefix_wait_s=0.0) == {"w0": 7, "w1": 6, "queued": 3}
    # With holds for promised blocks (the default) the followers of the spill wait for its blocks instead.
    assert _hot_prefix_run(FULL) == _hot_prefix_run(FULL, prefix_wait_s=30.0) == {"w0": 7, "w1": 3, "queued": 6}
    # Workers that publish no KV events are never waited for: nothing would say the blocks were stored.
    assert _hot_prefix_run(FULL, reports_stored=False) == {"w0": 7, "w1": 6, "queued": 3}


def test_a_new_theta_or_overhead_rebuilds_the_load_ordered_view():
    def two_workers(**cfg) -> tuple[WorkerPool, Scheduler, list[Worker]]:
        index, config = BlockIndex(), RouterConfig(**cfg)
        ledger = PendingLedger(index, ttl_s=10)
        pool = WorkerPool.without_http(config, index, ledger, on_change=lambda: None)
        for i in range(2):
            pool.admit(f"http://w{i}", replace(INFO, saturation=SaturationInfo(1e6, "profile", "calibrated")))
        return pool, Scheduler(config, pool, index, ledger, clock=Clock()), pool.routable()

    pool, sched, workers = two_workers(pool_calibrations=False)  # each worker keeps its own measurements
    first = sched.uniform_view(workers)
    assert first is not None and sched.uniform_view(workers) is first
    info = replace(INFO, saturation=SaturationInfo(5e6, "profile", "calibrated", request_overhead_flops=FULL))
    for w in workers:
        pool.install(w, info)
    view = sched.uniform_view(workers)
    assert view is not first and view.theta == 5e6
    measured_none = replace(info, saturation=replace(info.saturation, request_overhead_flops=0.0))
    pool.install(workers[0], measured_none)
    assert sched.uniform_view(workers) is None  # two cost models: the fast path's precondition fails
    # --request-overhead-flops pins one overhead for every worker (each measured its own): uniform.
    pool, sched, workers = two_workers(request_overhead_flops=1e5)
    first = sched.uniform_view(workers)
    pool.install(workers[0], measured_none)
    pool.install(workers[1], info)
    view = sched.uniform_view(workers)
    assert view is not None and view is not first and {w.request_overhead_flops for w in workers} == {1e5}
    assert workers[0].info.saturation.request_overhead_flops == 0.0  # the measurement itself is kept
    # Pooled (the default): workers of one kind share the median of what they measured, so again one cost model.
    pool, sched, workers = two_workers()
    pool.install(workers[0], measured_none)
    pool.install(workers[1], info)
    view = sched.uniform_view(workers)
    assert view is not None and {w.request_overhead_flops for w in workers} == {FULL / 2}


def test_pinned_overhead_must_not_be_negative():
    with pytest.raises(ValueError, match="request-overhead-flops"):
        RouterConfig(request_overhead_flops=-1.0).validate()
