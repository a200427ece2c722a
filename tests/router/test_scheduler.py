"""Placement, admission against Θ and the FIFO queue, on in-memory workers (no HTTP: the unit alone)."""

import asyncio
import functools
import gc

import pytest

from sgl_moe.flops import FlopsModel
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.candidates import job_cost
from sgl_moe.router.placement.job import Job, Placement
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.scheduler import QueueFull, QueueTimeout, Scheduler
from sgl_moe.wire import SaturationInfo, WorkerInfo

FLOPS = FlopsModel(linear_flops_per_token=1000.0, attn_flops_per_pair=10.0, lm_head_flops_per_token=100.0,
                   num_layers=2, num_moe_layers=2)
PAGE = 16
INFO = WorkerInfo(model_name="test", page_size=PAGE, flops=FLOPS, saturation=SaturationInfo(1.0, "test", "fixed"))


class Pool:
    """The part of WorkerPool the scheduler reads."""

    installs = 0

    def __init__(self, index, n, theta):
        self.workers = {}
        for i in range(n):
            w = Worker(id=f"w{i}", url=f"http://w{i}", info=INFO, flops=FLOPS, theta=theta,
                       theta_source="test", slots={0: index.add_target()})
            self.workers[w.id] = w

    def routable(self, exclude=frozenset()):
        return [w for w in self.workers.values() if w.state == "healthy" and w.id not in exclude]


def make(n=2, theta=1e6, **cfg):
    index = BlockIndex()
    ledger = PendingLedger(index, ttl_s=10)
    pool = Pool(index, n, theta)
    cfg.setdefault("prefix_wait_s", 30.0)  # holds are off by default (--prefix-wait-s 0); these tests use them
    return Scheduler(RouterConfig(**cfg), pool, index, ledger), pool, index


async def settle():
    """Let futures resolved by the scheduler reach their waiters (a few loop turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


def job(rid, blocks, n_tokens=None):
    keys = list(blocks)
    return Job(rid=rid, prompt_lens=[n_tokens or len(keys) * PAGE + 1], keys=[keys])


def test_cost_is_true_flops_after_prefix_credit():
    w = Worker(id="w", url="", info=INFO, flops=FLOPS, theta=1, theta_source="", slots={})
    j = Job(rid="r", prompt_lens=[100], keys=[[]])
    assert job_cost(w, j, [0]) == FLOPS.request_flops(0, 100)
    assert job_cost(w, j, [96]) == FLOPS.request_flops(96, 4)
    # Score-style unit: the shared query (64 tokens) is computed once, items pay only their suffix.
    unit = Job(rid="s", prompt_lens=[80, 80, 80], keys=[[], [], []], shared_prefix_len=64)
    assert job_cost(w, unit, [0, 0, 0]) == FLOPS.request_flops(0, 80) + 2 * FLOPS.request_flops(64, 16)


def test_burst_of_same_prefix_converges_through_pending_table():
    sched, pool, index = make(n=3)

    async def run():
        return [await sched.acquire(job(f"r{i}", [11, 12, 13])) for i in range(5)]

    placements = asyncio.run(run())
    assert {p.worker.id for p in placements} == {placements[0].worker.id}
    assert [p.matched_blocks for p in placements] == [0, 3, 3, 3, 3]
    # A different prefix goes to the least-loaded worker, not the busy one.
    other = asyncio.run(sched.acquire(job("x", [99])))
    assert other.worker.id != placements[0].worker.id


def test_saturated_worker_gets_nothing_and_queue_is_fifo():
    cost = FLOPS.request_flops(0, 3 * PAGE + 1)
    sched, pool, index = make(n=1, theta=cost * 1.5)

    async def run():
        first = await sched.acquire(job("a", [1, 2, 3]))
        second = await sched.acquire(job("b", [4, 5, 6]))  # admitted: in-flight < Θ before it
        assert pool.workers["w0"].inflight_flops >= pool.workers["w0"].theta
        waiting = [asyncio.ensure_future(sched.acquire(job(f"q{i}", [7 + i]))) for i in range(3)]
        await settle()
        assert len(sched.queue) == 3 and not any(t.done() for t in waiting)
        order = []
        for p in (first, second):
            sched.release(p, ok=True)
            await settle()
        while len(order) < 3:
            done = [t for t in waiting if t.done() and t not in order]
            assert done, "queue stalled"
            for t in done:
                order.append(t)
                sched.release(t.result(), ok=True)
            await settle()
        return [t.result().job.rid for t in order]

    assert asyncio.run(run()) == ["q0", "q1", "q2"]
    assert pool.workers["w0"].inflight_flops == 0.0 and pool.workers["w0"].inflight_requests == 0


def test_a_queued_request_leaves_no_reference_cycle_for_the_garbage_collector():
    """A queued job's future is answered with its placement, which refers back to the job. ``acquire`` lets go of
    the future once answered, so the request's objects go when it ends, by reference counting: left as a cycle per
    queued request, they were freed only by the cyclic collector, whose passes were 2-3% of the live router's CPU."""
    cost = FLOPS.request_flops(0, 3 * PAGE + 1)
    sched, pool, index = make(n=1, theta=cost * 1.5)

    async def run():
        first = await sched.acquire(job("a", [1, 2, 3]))
        second = await sched.acquire(job("b", [4, 5, 6]))
        asyncio.get_running_loop().call_later(0.01, functools.partial(sched.release, first, ok=True))
        placement = await sched.acquire(job("q", [7]))  # queues: w0 is saturated until ``first`` ends
        queued = placement.job.queued and placement.job.future is None
        sched.release(placement, ok=True)
        sched.release(second, ok=True)
        return queued

    gc.collect()
    gc.disable()
    try:
        assert asyncio.run(run())
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, Job) and o.rid == "q"
                or isinstance(o, Placement) and o.job.rid == "q"]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert sched.stats.queued == 1
    assert left == []


def test_concurrent_dispatch_cannot_overshoot_theta():
    cost = FLOPS.request_flops(0, 2 * PAGE + 1)
    sched, pool, index = make(n=2, theta=cost * 0.5)  # one request saturates a worker

    async def run():
        tasks = [asyncio.ensure_future(sched.acquire(job(f"r{i}", [100 + i, 200 + i]))) for i in range(6)]
        await settle()
        assert sum(t.done() for t in tasks) == 2
        assert all(w.inflight_requests == 1 for w in pool.workers.values())
        assert len(sched.queue) == 4
        for t in tasks:
            t.cancel()

    asyncio.run(run())


def test_queue_bound_answers_with_retry_after():
    sched, pool, index = make(n=1, theta=1.0, queue_size=2)

    async def run():
        await sched.acquire(job("a", [1]))
        waiting = [asyncio.ensure_future(sched.acquire(job(f"q{i}", [2]))) for i in range(2)]
        await settle()
        with pytest.raises(QueueFull) as exc:
            await sched.acquire(job("over", [3]))
        assert exc.value.retry_after_s >= 1
        for t in waiting:
            t.cancel()

    asyncio.run(run())


def test_hot_prefix_spills_when_recompute_is_cheaper_than_waiting():
    prefix = list(range(1, 9))  # 8 cached blocks (128 tokens), then a 64-token suffix
    n = len(prefix) * PAGE + 64
    hit = FLOPS.request_flops(len(prefix) * PAGE, 64)
    full = FLOPS.request_flops(0, n)
    # Waiting behind three hits costs more than recomputing the prefix elsewhere, even with the
    # recomputation's extra FLOPs counted twice (once for this request, once for the work behind it).
    assert 4 * hit > full + (full - hit)
    sched, pool, index = make(n=2, theta=hit * 2.5)
    w0 = pool.workers["w0"]
    index.store(w0.slots[0], prefix)

    async def run():
        return [await sched.acquire(job(f"h{i}", prefix, n)) for i in range(4)]

    placed = asyncio.run(run())
    assert [p.worker.id for p in placed[:3]] == ["w0", "w0", "w0"]  # w0 below Θ before each
    assert w0.inflight_flops >= w0.theta
    assert placed[3].worker.id == "w1" and placed[3].reason.startswith("spill")
    assert sched.stats.spills == 1


def test_waits_for_best_worker_when_recompute_is_expensive_without_blocking_others():
    prefix = list(range(1, 65))  # 64 cached blocks: recomputing them is far dearer than the load ahead
    n = len(prefix) * PAGE + 1
    hit_cost = FLOPS.request_flops(64 * PAGE, 1)
    sched, pool, index = make(n=2, theta=hit_cost * 1.0, max_affinity_wait_s=60)
    w0 = pool.workers["w0"]
    index.store(w0.slots[0], prefix)

    async def run():
        first = await sched.acquire(job("h0", prefix, n))
        assert first.worker is w0 and not w0.admissible
        hot = asyncio.ensure_future(sched.acquire(job("h1", prefix, n)))
        cold = asyncio.ensure_future(sched.acquire(job("c", [999])))
        await settle()
        assert not hot.done(), "should wait for w0 rather than recompute 64 blocks"
        assert cold.done() and cold.result().worker.id == "w1", "head-of-line blocking"
        sched.release(first, ok=True)
        await settle()
        assert hot.done() and hot.result().worker is w0

    asyncio.run(run())


@pytest.mark.parametrize("policy", ["round_robin", "least_flops"])
def test_baseline_policies_ignore_affinity(policy):
    sched, pool, index = make(n=2, policy=policy)

    async def run():
        return [(await sched.acquire(job(f"r{i}", [1, 2]))).worker.id for i in range(4)]

    assert sorted(asyncio.run(run())) == ["w0", "w0", "w1", "w1"]


def test_request_waits_for_prefix_blocks_another_request_is_computing():
    # Θ leaves room for a but not for computing a's prefix a second time: holding b pays.
    sched, pool, index = make(n=2, theta=1.5 * FLOPS.request_flops(0, 8 * PAGE + 1), prefix_wait_min_tokens=4 * PAGE)

    async def run():
        a = await sched.acquire(job("a", range(1, 9)))
        b = asyncio.ensure_future(sched.acquire(job("b", [*range(1, 9), 50])))
        short = await sched.acquire(job("c", [1, 2, 3, 60]))  # its promised part (3 pages) is below the minimum
        await settle()
        held = not b.done()
        index.store(a.slot, range(1, 9))  # the worker reports a's blocks stored...
        sched.pump()                      # ...and the event sink pumps the queue
        await settle()
        return a, (await b), short, held

    a, b, short, held = asyncio.run(run())
    assert held and sched.stats.prefix_waits == 1
    assert b.worker is a.worker and b.matched_blocks == 8 and b.predicted_cached_tokens == 8 * PAGE
    assert short.worker is a.worker and short.matched_blocks == 3


def test_prefix_wait_ends_when_the_computing_request_fails_or_time_runs_out():
    theta = 1.5 * FLOPS.request_flops(0, 4 * PAGE + 1)  # no room for the duplicate: the wait pays
    sched, pool, index = make(n=2, theta=theta, prefix_wait_min_tokens=PAGE)

    async def failed():
        a = await sched.acquire(job("a", [1, 2, 3, 4]))
        b = asyncio.ensure_future(sched.acquire(job("b", [1, 2, 3, 4, 5])))
        await settle()
        assert not b.done()
        sched.release(a, ok=False)  # the promise is withdrawn: nothing left to wait for
        await settle()
        return await b

    assert asyncio.run(failed()).matched_blocks == 0
    sched, pool, index = make(n=2, theta=theta, prefix_wait_min_tokens=PAGE, prefix_wait_s=0.05)

    async def expired():
        await sched.acquire(job("a", [1, 2, 3, 4]))
        return await asyncio.wait_for(sched.acquire(job("b", [1, 2, 3, 4, 5])), 5)

    late = asyncio.run(expired())
    assert late.queued_s >= 0.05 and late.matched_blocks == 4  # goes ahead, still to the promising worker
    sched, pool, index = make(n=2, theta=theta, prefix_wait_min_tokens=PAGE, prefix_wait_s=0)

    async def disabled():
        await sched.acquire(job("a", [1, 2, 3, 4]))
        return await asyncio.wait_for(sched.acquire(job("b", [1, 2, 3, 4, 5])), 5)

    assert asyncio.run(disabled()).queued_s < 0.05 and sched.stats.prefix_waits == 0


def test_releases_of_one_batch_coalesce_into_one_queue_scan():
    """With ``pump_soon`` (the router's once-per-loop-turn pump), the releases of a batch that ends together
    scan the queue once, not once each; the queued requests still start in FIFO order."""
    cost = FLOPS.request_flops(0, 3 * PAGE + 1)
    sched, pool, index = make(n=1, theta=cost * 2.5)  # three requests in flight saturate the worker

    async def run():
        due = []

        def pump_soon():
            if not due:
                due.append(asyncio.get_running_loop().call_soon(lambda: (due.clear(), sched.pump())))

        sched.pump_soon = pump_soon
        running = [await sched.acquire(job(f"r{i}", [10 * i + 1, 10 * i + 2, 10 * i + 3])) for i in range(3)]
        waiting = [asyncio.ensure_future(sched.acquire(job(f"q{i}", [1000 + 10 * i, 1001 + 10 * i, 1002 + 10 * i])))
                   for i in range(4)]
        await settle()
        assert len(sched.queue) == 4
        pumps, scanned = sched.stats.pumps, sched.stats.rescored
        for p in running:  # the batch ends: three releases in one turn of the loop
            sched.release(p, ok=True)
        assert sched.stats.pumps == pumps  # nothing scanned yet: one scan is due
        await settle()
        assert sched.stats.pumps == pumps + 1
        assert sched.stats.rescored - scanned == 3  # three placed (the fourth found no room: the scan stopped)
        return [t.result().job.rid for t in waiting if t.done()]

    assert asyncio.run(run()) == ["q0", "q1", "q2"]


def test_without_pump_soon_each_release_scans_the_queue():
    """The simulator's path (no ``pump_soon``): ``release`` pumps at once, as the placements it replays expect."""
    cost = FLOPS.request_flops(0, 3 * PAGE + 1)
    sched, pool, index = make(n=1, theta=cost * 2.5)

    async def run():
        running = [await sched.acquire(job(f"r{i}", [10 * i + 1, 10 * i + 2, 10 * i + 3])) for i in range(3)]
        waiting = [asyncio.ensure_future(sched.acquire(job(f"q{i}", [1000 + 10 * i, 1001 + 10 * i, 1002 + 10 * i])))
                   for i in range(4)]
        await settle()
        pumps = sched.stats.pumps
        for p in running:
            sched.release(p, ok=True)
        assert sched.stats.pumps == pumps + 3
        await settle()
        return [t.result().job.rid for t in waiting if t.done()]

    assert asyncio.run(run()) == ["q0", "q1", "q2"]


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
def test_a_waiter_cancelled_as_its_job_is_placed_gets_no_placement_and_the_load_is_given_back(turns):
    """The queue places a job (its future resolved), and the waiting request is cancelled ``turns`` loop turns
    later, before it resumes: ``acquire`` raises CancelledError and the reservation is returned, whatever
    ``asyncio.wait_for`` does with a cancellation that races its result (Python 3.11 returns the result and
    drops the cancellation; a placement owner that already handled the front's Cancel then held the load for
    good)."""
    cost = FLOPS.request_flops(0, 2 * PAGE + 1)
    sched, pool, index = make(n=1, theta=cost * 0.5)
    w = pool.workers["w0"]

    async def run():
        first = await sched.acquire(job("a", [1, 2]))
        waiting = asyncio.ensure_future(sched.acquire(job("b", [3, 4])))
        await settle()
        assert len(sched.queue) == 1
        sched.release(first, ok=True)  # the pump places "b" now
        for _ in range(turns):
            await asyncio.sleep(0)
        if waiting.done():  # resumed already: nothing raced
            sched.release(waiting.result(), ok=True)
            return "placed"
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return "cancelled"

    outcome = asyncio.run(run())
    assert outcome == "cancelled" or turns > 0
    assert w.inflight_requests == 0 and w.inflight_flops == 0.0, (outcome, w.inflight_requests)


def test_a_job_queued_past_the_queue_timeout_leaves_the_queue_with_queue_timeout():
    cost = FLOPS.request_flops(0, 2 * PAGE + 1)
    sched, pool, index = make(n=1, theta=cost * 0.5, queue_timeout_s=0.05)

    async def run():
        first = await sched.acquire(job("a", [1, 2]))
        with pytest.raises(QueueTimeout, match="within 0 s"):
            await sched.acquire(job("b", [3, 4]))
        assert not sched.queue and sched.stats.queue_timeouts == 1
        sched.release(first, ok=True)

    asyncio.run(run())
    assert pool.workers["w0"].inflight_requests == 0


def test_a_waiter_cancelled_as_its_job_times_out_raises_cancelled_error():
    """The queue timeout fails the job in the turn its client leaves: the client's task ends cancelled (not with the
    timeout's error, which nobody would read), and nothing was reserved."""
    cost = FLOPS.request_flops(0, 2 * PAGE + 1)
    sched, pool, index = make(n=1, theta=cost * 0.5)

    async def run():
        first = await sched.acquire(job("a", [1, 2]))
        waiting = asyncio.ensure_future(sched.acquire(job("b", [3, 4])))
        await settle()
        [queued] = sched.queue
        sched._expire(queued)  # what the queue-timeout timer does
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        sched.release(first, ok=True)

    asyncio.run(run())
    assert pool.workers["w0"].inflight_requests == 0 and pool.workers["w0"].inflight_flops == 0.0
