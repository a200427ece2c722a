"""The simulator's shortcuts around the router's scheduler: each one changes no decision.

Whole runs in a backlog (every kind of certificate used) place every request on the same worker at the same
cost with and without the memo; round robin's room list and the view shortcut place as the plain router;
the spill threshold the memo learns is the policy's; the remembered block matches and the queued cost ahead
answer as the router's own computations do (round robin's room list: ``test_router_placement``).
"""

import random
from dataclasses import replace

import pytest

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.candidates import Candidate
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.policy import DEFERRED, PlacementPolicy
from sgl_moe.router.placement.scheduler import SchedulerStats
from sgl_moe.simulator import SimConfig, Simulation, UnitStream, h100_30b
from sgl_moe.simulator.certificate import Certificate, QueueLog, Waiters
from sgl_moe.simulator.logged_index import LoggedBlockIndex
from sgl_moe.simulator.router_frontend import worker_info
from sgl_moe.simulator.spill_rule import spill_penalty
from sgl_moe.simulator.watch_lists import WatchLists
from sgl_moe.workloads import WorkloadConfig


def placements(cfg, stream, memo):
    sim = Simulation(replace(cfg, memo=memo), h100_30b(), UnitStream(stream))
    deliver = sim.frontend._on_placed
    order = []

    def record(p):
        order.append((p.job.rid, p.worker.id, p.cost, p.matched_blocks))
        deliver(p)

    sim.frontend._on_placed = record
    sim.run()
    return order, sim.frontend.scheduler


@pytest.mark.parametrize("workers,requests,theta_tokens", [(16, 2000, 2000), (32, 3000, 2000), (64, 3000, 500)])
def test_memo_places_as_the_plain_scheduler_in_a_backlog(workers, requests, theta_tokens):
    cal = h100_30b()
    # Holds for promised blocks on (the router's --prefix-wait-s, off by default): every kind of certificate
    cfg = SimConfig(workers=workers, policy="longest_block_match", theta_flops=cal.flops.request_flops(0, theta_tokens),
                    prefix_wait_s=30.0)
    stream = WorkloadConfig(requests=requests, seed=3)
    with_memo, memo = placements(cfg, stream, memo=True)
    plain, reference = placements(cfg, stream, memo=False)
    assert with_memo == plain
    # every shortcut was taken (else this test would prove nothing about it)
    assert memo.certified["deferred"] > 100 and memo.certified["held"] > 50 and memo.certified["rule5"] > 100
    # (Held jobs kept through their worker's saturation, ``Certificate.needs_room``, ``held_again`` and
    # ``held_dropped``, are no longer seen here: the frontend pumps once after a step's releases, as the router's
    # pump_soon does, and the worker's room comes back with that pump. Whatever shortcut is taken, the placements
    # above are the plain scheduler's.)
    # rule-5 jobs whose threshold a release crossed: left to the second pass, or re-armed on a check
    assert memo.spill_passed > 50 and memo.spill_rechecked > 0
    # the memo's point: most jobs are not rescored (4.7x fewer at 16 workers with h100_30b refitted on an H100,
    # whose 22 ms fixed step shapes the backlog differently; over 5x with the assumed 1.5 ms step)
    assert memo.scored < reference.scored / 4


@pytest.mark.parametrize("workers,requests,theta_tokens", [(16, 2000, 2000), (64, 3000, 500)])
def test_memo_places_as_the_plain_scheduler_with_the_routers_defaults(workers, requests, theta_tokens):
    cal = h100_30b()
    cfg = SimConfig(workers=workers, policy="longest_block_match", theta_flops=cal.flops.request_flops(0, theta_tokens))
    assert cfg.prefix_wait_s == RouterConfig.prefix_wait_s
    stream = WorkloadConfig(requests=requests, seed=3)
    with_memo, memo = placements(cfg, stream, memo=True)
    plain, reference = placements(cfg, stream, memo=False)
    assert with_memo == plain
    # holds for promised blocks are on by default (--prefix-wait-s 1): held jobs are certified too
    assert memo.certified["deferred"] > 100 and memo.certified["rule5"] > 50 and memo.certified["held"] > 0
    assert memo.scored < reference.scored / 3


def test_learned_spill_threshold_is_the_policys():
    cal = h100_30b()
    cfg = RouterConfig(policy="longest_block_match", saturation_flops=cal.theta, hold_spills=False)
    info = worker_info(cal, cal.theta)
    k = spill_penalty(cfg, info)
    assert k is not None
    assert spill_penalty(replace(cfg, max_affinity_wait_s=0.0), info) is None  # every wait is over at once
    index = BlockIndex()
    pool = WorkerPool.without_http(cfg, index, PendingLedger(index, ttl_s=1.0), lambda: None)
    a, b = pool.admit("x://a", info, worker_id="a"), pool.admit("x://b", info, worker_id="b")
    theta = a.theta
    policy = PlacementPolicy(cfg, lambda: 0.0, SchedulerStats(), lambda job, worker: 0.0)
    policy.defer_spills = True
    rng = random.Random(0)
    for _ in range(300):
        best_cost, alt_cost, ahead = (rng.uniform(0.01, 0.5) * theta for _ in range(3))
        alt_load = rng.uniform(0, 0.999) * theta
        a.inflight_flops, b.inflight_flops = theta + ahead, alt_load
        job = Job(rid="j", prompt_lens=[64], keys=[[1, 2, 3]], arrived=0.0)
        best = Candidate(a, 0, 0, 1, (16,), best_cost)
        alt = Candidate(b, 1, 0, 0, (0,), alt_cost)
        choice, reason = policy.longest_block_match(job, [best, alt], [alt])
        threshold = theta + ahead + best_cost - alt_cost - k * max(0.0, alt_cost - best_cost)
        assert reason.startswith(DEFERRED) == (alt_load < threshold)


def test_remembered_matches_follow_every_mutation():
    rng = random.Random(1)
    logged, plain = LoggedBlockIndex(), BlockIndex()
    for _ in range(6):
        assert logged.add_target() == plain.add_target()
    lists = [[rng.randrange(40) for _ in range(rng.randrange(1, 12))] for _ in range(30)]
    mask = (1 << 6) - 1
    for step in range(3000):
        op = rng.randrange(5)
        slot, hashes = rng.randrange(6), rng.sample(range(40), rng.randrange(1, 6))
        if op == 0:
            logged.store(slot, hashes), plain.store(slot, hashes)
        elif op == 1:
            logged.remove(slot, hashes), plain.remove(slot, hashes)
        elif op == 2:
            logged.promise(slot, hashes), plain.promise(slot, hashes)
        elif op == 3:
            logged.retire(slot, hashes), plain.retire(slot, hashes)
        elif step % 500 == 0:
            logged.clear_committed(slot), plain.clear_committed(slot)
        for keys in rng.sample(lists, 5):
            assert logged.match_groups(keys, mask) == plain.match_groups(keys, mask)


class _Scanning(BlockIndex):
    """Counts the scans ``match_groups`` makes (under ``LoggedBlockIndex``: those its memo did not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    def match_groups(self, hashes, slots_mask):
        self.scans += 1
        return super().match_groups(hashes, slots_mask)


class _CountedLogged(LoggedBlockIndex, _Scanning):
    pass


def test_remembered_matches_follow_mutations_of_shared_prefixes():
    """Prefix chains as the router sees them (lists sharing leading blocks, targets holding runs of them), the
    same lists asked again after each mutation: answers kept across gains past their frontier and losses on
    other slots, dropped on a frontier gain or a loss in a group's run."""
    rng = random.Random(5)
    logged, plain = _CountedLogged(), BlockIndex()
    slots = 12
    for _ in range(slots):
        assert logged.add_target() == plain.add_target()
    roots = [[rng.getrandbits(40) for _ in range(30)] for _ in range(16)]
    lists = [root[:rng.randrange(1, 31)] + [rng.getrandbits(40) for _ in range(rng.randrange(0, 5))]
             for root in roots for _ in range(2)]
    mask = (1 << slots) - 1 - 5  # one mask, as the scheduler's view asks (a list is remembered for one)
    kept = 0
    for step in range(6000):
        op, slot = rng.randrange(4), rng.randrange(slots)
        keys = rng.choice(lists)
        lo = 0 if op in (0, 2) and rng.random() < 0.7 else rng.randrange(len(keys))
        hashes = keys[lo:rng.randrange(lo, len(keys)) + 1] if op in (0, 2) else [keys[lo]]
        if op == 0:
            assert logged.store(slot, hashes) == plain.store(slot, hashes)
        elif op == 1:
            assert logged.remove(slot, hashes) == plain.remove(slot, hashes)
        elif op == 2:
            assert logged.promise(slot, hashes) == plain.promise(slot, hashes)
        else:
            assert logged.retire(slot, hashes) == plain.retire(slot, hashes)
        for keys in lists[step // 50 % 8 * 4:][:4]:
            before = logged.scans
            assert logged.match_groups(keys, mask) == plain.match_groups(keys, mask)
            kept += logged.scans == before
    assert kept > 10000  # most answers were remembered (the scan was not run again)


def test_waiters_sum_the_cost_ahead_in_queue_order():
    rng = random.Random(2)
    queue = QueueLog(lambda job, in_window: None)
    waiters = Waiters(queue.number)
    jobs = [Job(rid=str(i), prompt_lens=[1], keys=[]) for i in range(60)]
    for job in jobs:
        queue.append(job)
    for _ in range(400):
        job = rng.choice([j for j in jobs if j in queue.number])
        before = job.waiting_for
        if rng.random() < 0.1:
            waiters.left(job, before)
            queue.remove(job)
            queue.forget(job)
            continue
        job.waiting_for = rng.choice([None, "a", "b", "c"])
        job.waiting_cost = rng.uniform(0, 1e12)
        waiters.moved(job, before)
        at = rng.choice(list(queue))
        waiters.job = at
        for w in ("a", "b", "c"):
            running = {}
            for other in queue:  # Scheduler.pump's running sum as it reaches ``at``
                if other is at:
                    break
                if other.waiting_for is not None:
                    running[other.waiting_for] = running.get(other.waiting_for, 0.0) + other.waiting_cost
            assert waiters.get(w, 0.0) == running.get(w, 0.0)


class _Sink:
    def __init__(self):
        self.marked = []

    def mark_dirty(self, job):
        self.marked.append(job.rid)

    def mark_held_revisit(self, job, worker):
        self.marked.append(job.rid)
        self.revisited_for = worker.id


def test_a_held_job_is_revisited_when_its_worker_saturates_and_broken_when_another_gets_lighter():
    cal = h100_30b()
    cfg = RouterConfig(policy="longest_block_match", saturation_flops=cal.theta, hold_spills=False)
    info = worker_info(cal, cal.theta)
    index = BlockIndex()
    pool = WorkerPool.without_http(cfg, index, PendingLedger(index, ttl_s=1.0), lambda: None)
    a, b = pool.admit("x://a", info, worker_id="a"), pool.admit("x://b", info, worker_id="b")
    theta = a.theta
    watches, sink = WatchLists(), _Sink()
    job = Job(rid="held", prompt_lens=[64], keys=[[1, 2, 3]], arrived=0.0)
    c = Certificate(sink, job, None, "a", None, float("inf"), None)
    c.needs_room = a
    (slot_a,) = a.slots.values()
    a.inflight_flops, b.inflight_flops = 0.5 * theta, 0.8 * theta
    watches.add(watches.on_heavier, slot_a, (c, (b,)))

    a.inflight_flops = 0.7 * theta  # heavier, still the lightest of the two: nothing to do
    watches.reserved(a)
    assert c.clean and sink.marked == [] and c.holds()
    b.inflight_flops = 1.5 * theta  # b saturated too: a stays the best when it saturates
    a.inflight_flops = 1.2 * theta
    watches.reserved(a)
    assert c.clean and sink.marked == ["held"]  # visited by the next pass, scored there only while a is saturated
    assert sink.revisited_for == "a"  # (the memo drops the visit if a has room again before a pass reaches it)
    assert not c.holds()
    a.inflight_flops = 0.6 * theta  # a request of a ended: room again, held as before
    assert c.holds()
    b.inflight_flops = 0.65 * theta  # b got lighter than it was (its own release is watched elsewhere) ...
    a.inflight_flops = 0.7 * theta  # ... and a reservation makes a heavier than b: b is the best now
    watches.reserved(a)
    assert not c.clean and sink.marked == ["held", "held"]


def test_a_release_below_a_rule5_threshold_makes_the_spill_due_once():
    cal = h100_30b()
    cfg = RouterConfig(policy="longest_block_match", saturation_flops=cal.theta, hold_spills=False)
    info = worker_info(cal, cal.theta)
    index = BlockIndex()
    pool = WorkerPool.without_http(cfg, index, PendingLedger(index, ttl_s=1.0), lambda: None)
    x = pool.admit("x://x", info, worker_id="x")
    theta = x.theta
    watches, sink = WatchLists(), _Sink()
    job = Job(rid="waiting", prompt_lens=[64], keys=[[1, 2, 3]], arrived=0.0)
    c = Certificate(sink, job, None, "a", 0.0, float("inf"), 0.5 * theta)
    watches.add_rule5(c, c.threshold)
    watches.released(x, 0.6 * theta)  # not below the threshold: still waiting
    assert c.holds() and sink.marked == []
    watches.released(x, 0.4 * theta)  # a spill to x may pay now: visited, scored unless a check re-arms it
    assert c.clean and c.spill_due and not c.holds() and sink.marked == ["waiting"]
    watches.released(x, 0.1 * theta)  # out of the heap until re-armed: not marked twice
    assert sink.marked == ["waiting"] and watches.rule5 == []


def test_queue_log_drops_a_job_wherever_it_is_queued():
    rng = random.Random(4)
    queue, reference = QueueLog(lambda job, in_window: None), []
    for step in range(3000):
        if rng.random() < 0.55 or not reference:
            job = Job(rid=str(step), prompt_lens=[1], keys=[])
            queue.append(job)
            reference.append(job)
        else:
            job = reference[0] if rng.random() < 0.3 else rng.choice(reference)
            queue.drop(job)
            reference.remove(job)
        assert list(queue) == reference and set(queue.number) == set(reference)
