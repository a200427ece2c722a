"""The scheduler's load-ordered fast path chooses exactly what scoring every worker chooses.

Two schedulers see the same seeded history (placements, queued jobs pumped on release, releases, KV
events, exclusions, health changes, promise expiry); one has ``scan_all`` set. Every placement must
agree, and inside ``pump`` the running sums of queued waiting costs equal the queue walk they replace.
"""

import random

import pytest

from sgl_moe.flops import FlopsModel
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement import load_order
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.scheduler import Scheduler
from sgl_moe.wire import SaturationInfo, WorkerInfo

PAGE = 16
FLOPS = FlopsModel(linear_flops_per_token=1000.0, attn_flops_per_pair=10.0, lm_head_flops_per_token=100.0,
                   num_layers=2, num_moe_layers=2)
INFO = WorkerInfo(model_name="test", page_size=PAGE, flops=FLOPS, saturation=SaturationInfo(1.0, "test", "fixed"))


class Pool:
    installs = 0

    def __init__(self, workers):
        self.workers = {w.id: w for w in workers}

    def routable(self, exclude=frozenset()):
        return [w for w in self.workers.values() if w.state == "healthy" and w.id not in exclude]


class Future:
    """What pump needs of an asyncio future; a result is handed to ``deliver`` at once."""

    def __init__(self, deliver):
        self.deliver = deliver
        self._done = False

    def done(self):
        return self._done

    def set_result(self, placement):
        self._done = True
        self.deliver(placement)

    def set_exception(self, exc):
        self._done = True


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def build(n, policy, uniform, dp, clock, homes=False, scheduler=None, **cfg):
    index = BlockIndex()
    ledger = PendingLedger(index, ttl_s=5)
    rng = random.Random(n)
    workers = []
    for i in range(n):
        theta = 4e6 if uniform else rng.choice([2e6, 4e6, 8e6])
        slots = {r: index.add_target() for r in range(dp if i % 2 else 1)}
        workers.append(Worker(id=f"w{i:02d}", url="", info=INFO, flops=FLOPS, theta=theta,
                              theta_source="test", slots=slots))
    sched = (scheduler or Scheduler)(RouterConfig(policy=policy, max_affinity_wait_s=2.0, prefix_homes=homes, **cfg),
                                     Pool(workers), index, ledger, clock=clock)
    return sched, index, ledger


def run_history(sched, index, ledger, clock, seed, steps=2500, no_affinity=0.0, evict_everywhere=False):
    """Drive one scheduler through a seeded history; every placement as a comparable tuple. A share
    ``no_affinity`` of the requests carries no block keys (placed by load alone); ``evict_everywhere``: an
    eviction removes a whole prefix from every worker (bounded pools), else part of it from one."""
    rng = random.Random(seed)
    prefixes = [[rng.getrandbits(62) for _ in range(rng.randint(1, 40))] for _ in range(12)]
    live, out = [], []
    pool = sched.pool

    def record(p):
        out.append((p.job.rid, p.worker.id, p.slot, p.cost, p.matched_blocks, p.predicted_cached_tokens,
                    p.reason.split(":")[0]))
        live.append(p)

    for step in range(steps):
        clock.t += rng.random() * 0.05
        op = rng.random()
        if op < 0.5:
            keys, lens = [], []
            for _ in range(rng.choice([1, 1, 1, 2])):
                k = list(rng.choice(prefixes)) + [rng.getrandbits(62) for _ in range(rng.randint(0, 6))]
                keys.append(k)
                lens.append(len(k) * PAGE + rng.randint(1, PAGE))
            if no_affinity and rng.random() < no_affinity:
                keys = []
            exclude = frozenset([rng.choice(list(pool.workers))]) if rng.random() < 0.05 else frozenset()
            job = Job(rid=f"r{step}", prompt_lens=lens, keys=keys, exclude=exclude, arrived=clock.t)
            placed = sched.try_place(job) if not sched.queue else None  # what acquire() does
            if placed is not None:
                record(placed)
            else:
                job.future = Future(record)
                sched.queue.append(job)
                sched.pump()
        elif op < 0.85 and live:
            p = live.pop(rng.randrange(len(live)))
            sched.release(p, ok=rng.random() < 0.95)
            if p.promise is not None and rng.random() < 0.8:
                ledger.on_stored(p.slot, index.store(p.slot, p.promise.keys))
        elif op < 0.9:
            w = rng.choice(list(pool.workers.values()))
            pre = rng.choice(prefixes)
            if evict_everywhere:
                for x in pool.workers.values():
                    for slot in x.slots.values():
                        index.remove(slot, pre)
            else:
                index.remove(rng.choice(list(w.slots.values())), pre[rng.randrange(len(pre)):])
        elif op < 0.92:
            w = rng.choice(list(pool.workers.values()))
            w.state = "unhealthy" if w.state == "healthy" else "healthy"
            sched.pump()
        else:
            ledger.expire(now=clock.t)
            sched.pump()
    return out


@pytest.mark.parametrize("policy", ["longest_block_match", "least_flops", "round_robin"])
@pytest.mark.parametrize("uniform,dp,direct", [(True, 1, 16), (True, 1, 0), (True, 2, 16), (False, 1, 16)])
def test_fast_path_places_exactly_like_scoring_every_worker(policy, uniform, dp, direct, monkeypatch):
    """``direct`` 0 makes every group of prefix holders be searched along the load order."""
    monkeypatch.setattr(load_order, "DIRECT_GROUP", direct)
    walk = Scheduler.queued_cost_before
    checked = []

    class BothWays(Scheduler):  # a subclass, not a patch: a compiled Scheduler's methods cannot be replaced
        def queued_cost_before(self, job, worker):
            kept = walk(self, job, worker)
            sums, self.ahead = self.ahead, None
            try:
                assert walk(self, job, worker) == kept
            finally:
                self.ahead = sums
            checked.append(kept)
            return kept

    results = []
    for scan_all in (False, True):
        clock = Clock()
        sched, index, ledger = build(9, policy, uniform, dp, clock, scheduler=BothWays)
        sched.scan_all = scan_all
        results.append(run_history(sched, index, ledger, clock, seed=len(policy) * 10 + dp + 3 * uniform))
    fast, reference = results
    assert len(fast) > 300
    assert fast == reference
    if policy == "longest_block_match":  # every branch of the policy was taken
        reasons = {r for *_, r in fast}
        assert {"spill", "no prefix match anywhere"} <= reasons
        assert any(r.startswith("longest prefix match") for r in reasons)
        if uniform:
            assert any(c > 0 for c in checked), "no queued job ever waited behind another for the same worker"


@pytest.mark.parametrize("uniform,dp", [(True, 1), (True, 2), (False, 1)])
def test_prefix_homes_place_exactly_alike_on_both_paths(uniform, dp):
    """With ``prefix_homes`` a job matching nothing goes to (or, in a pump's first pass, is deferred for) its
    prefix's home, on both paths alike. Holds are off here: with them (the default) the followers of a new
    prefix wait for its leader's blocks, and the history homes too few jobs to show the rule."""
    results = []
    for scan_all in (False, True):
        clock = Clock()
        sched, index, ledger = build(9, "longest_block_match", uniform, dp, clock, homes=True, prefix_wait_s=0.0)
        sched.scan_all = scan_all
        results.append(run_history(sched, index, ledger, clock, seed=7 + dp + 3 * uniform, evict_everywhere=True))
    fast, reference = results
    assert len(fast) > 300
    assert fast == reference
    homed = [r for *_, r in fast if r.startswith("no prefix match anywhere; its prefix last went to")]
    assert len(homed) >= 3, len(homed)


@pytest.mark.parametrize("policy", ["longest_block_match", "least_flops", "round_robin"])
@pytest.mark.parametrize("uniform,dp", [(True, 1), (True, 2), (False, 1)])
def test_jobs_without_keys_are_placed_alike_on_both_paths(policy, uniform, dp):
    """Requests without affinity (no block keys) among affine ones: the same placements, and under the load
    policies the workers take turns when equally loaded."""
    results = []
    for scan_all in (False, True):
        clock = Clock()
        sched, index, ledger = build(9, policy, uniform, dp, clock)
        sched.scan_all = scan_all
        results.append(run_history(sched, index, ledger, clock, seed=7 + dp + 3 * uniform, no_affinity=0.4))
    fast, reference = results
    assert len(fast) > 300
    assert fast == reference
    if policy != "round_robin":
        by_load = [w for _, w, *_, reason in fast if reason.startswith("no affinity")]
        assert len(by_load) > 100 and len(set(by_load)) == 9
