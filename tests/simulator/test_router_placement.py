"""The simulator places exactly as the router's Scheduler does when driven through its async API.

The simulated run records every operation on the router (requests arriving, releases, KV-event batches,
hold timers, promise expiry). A fresh, plain ``Scheduler`` (no memo) then gets the same operations the
way the router's service issues them: ``await acquire(job)`` per request, ``release`` per answer (the
service's ``pump_soon`` pump after a step's answers is recorded as a pump), the pool's ``events.on_batch``
per event batch (which pumps, as the service's on_change does), on a fake clock set to each operation's
time. Every request must land on the same worker with the same cost.
"""

import asyncio

import pytest

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.event_listener import EventSource
from sgl_moe.router.membership.kv_events import BlockRemoved, BlockStored, EventBatch
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.scheduler import Scheduler
from sgl_moe.simulator import SimConfig, Simulation, SimUnit, UnitStream, cpu_tiny, h100_30b
from sgl_moe.simulator.router_frontend import SimPool
from sgl_moe.workloads import WorkloadConfig


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


async def settle():
    for _ in range(6):
        await asyncio.sleep(0)


def replay(trace, sim, offline_all_at_zero):
    """Run ``trace`` against a plain Scheduler through ``acquire``; returns rid -> (worker, cost, blocks)."""
    front = sim.frontend
    cfg = RouterConfig(**{**front.cfg.__dict__, "queue_size": 10**9})
    clock = Clock()
    index = BlockIndex()
    ledger = PendingLedger(index, ttl_s=cfg.pending_ttl_s)
    holder = {}
    pool = SimPool.of(cfg, index, ledger, {w.id: w.info for w in front.workers}, on_change=lambda: holder["s"].pump())
    workers = list(pool.workers.values())
    sched = holder["s"] = Scheduler(cfg, pool, index, ledger, clock=clock)
    # The service's pump_soon pumps once after a batch's releases; the trace records that pump as a "pump" op.
    sched.pump_soon = lambda: None
    sources = {w.id: EventSource(worker_id=w.id, dp_rank=0, endpoint="x", replay_endpoint=None) for w in workers}
    tasks = {}

    async def run():
        seq = 0
        submits = [op for op in trace if op[0] in ("submit", "queued")]
        if offline_all_at_zero:  # every request was sent at t=0: acquire them all first, in order
            for _, _t, rid, tokens, keys in submits:
                tasks[rid] = asyncio.ensure_future(sched.acquire(Job(rid=rid, prompt_lens=[tokens], keys=[keys],
                                                                     arrived=0.0)))
                await settle()
        for op in trace:
            clock.t = op[1]
            kind = op[0]
            if kind in ("submit", "queued"):
                if not offline_all_at_zero:
                    _, t, rid, tokens, keys = op
                    tasks[rid] = asyncio.ensure_future(sched.acquire(Job(rid=rid, prompt_lens=[tokens], keys=[keys],
                                                                         arrived=t)))
            elif kind == "release":
                sched.release(tasks[op[2]].result(), ok=True)
            elif kind == "events":
                _, t, wid, removed, stored = op
                events = ([BlockRemoved(block_hashes=removed)] if removed else []) + (
                    [BlockStored(block_hashes=stored, parent_block_hash=None, block_size=16)]
                    if stored else [])
                seq += 1
                pool.events.on_batch(sources[wid], EventBatch(seq=seq, ts=t, events=events, dp_rank=0))
            elif kind == "pump":
                sched.pump()
            elif kind == "expire":
                ledger.expire(now=t)
            await settle()
        return {rid: task.result() for rid, task in tasks.items()}

    placements = asyncio.run(run())
    return {rid: (p.worker.id, p.cost, p.matched_blocks) for rid, p in placements.items()}


def run_traced(cfg, cal, units):
    sim = Simulation(cfg, cal, units)
    sim.frontend.trace = []
    placed = {}
    deliver = sim.frontend._on_placed

    def record(p):
        placed[p.job.rid] = (p.worker.id, p.cost, p.matched_blocks)
        deliver(p)

    sim.frontend._on_placed = record  # every placement, as the router made it
    result = sim.run()
    return sim, placed, result


def hand_made_units():
    """Four prompt families sharing long prefixes, interleaved; lengths 40..400 tokens."""
    units = []
    families = [[1000 * f + b for b in range(24)] for f in range(4)]
    for i in range(48):
        f = families[i % 4]
        prefix_blocks = 4 + (i * 7) % 18
        tail = [10**6 + i * 100 + b for b in range(1 + i % 3)]
        hashes = f[:prefix_blocks] + tail
        tokens = len(hashes) * 16 + 5
        units.append(SimUnit(f"u{i}", f"t{i}", [], tokens, hashes, 0))
    return units


def test_hand_made_stream_is_placed_as_the_router_places_it():
    cal = cpu_tiny()
    theta = cal.flops.request_flops(0, 300)  # about one request per worker: queueing, holds and spills
    cfg = SimConfig(workers=3, policy="longest_block_match", arrival="closed", concurrency=12, theta_flops=theta,
                    max_affinity_wait_s=0.3, pending_ttl_s=1.0, prefix_wait_s=30.0)  # holds on (off by default)
    sim, placed, result = run_traced(cfg, cal, hand_made_units())
    assert result.units == 48 and len(placed) == 48
    stats = sim.frontend.scheduler.stats
    assert stats.queued > 10 and stats.spills > 5 and stats.prefix_waits > 5
    assert len({w for w, _, _ in placed.values()}) == 3
    assert replay(sim.frontend.trace, sim, offline_all_at_zero=False) == placed


def test_offline_workload_run_is_placed_as_the_router_places_it():
    """Offline: every request sent at t=0 into the router's queue (the simulator materialises only its head)."""
    cal = h100_30b()
    stream = UnitStream(WorkloadConfig(requests=560, seed=3, workloads=("moral", "boolq", "quality", "arxiv")))
    cfg = SimConfig(workers=5, policy="longest_block_match", theta_flops=cal.flops.request_flops(0, 2000))
    sim, placed, result = run_traced(cfg, cal, stream)
    assert result.units > 513 and len(placed) == result.units
    assert replay(sim.frontend.trace, sim, offline_all_at_zero=True) == placed


@pytest.mark.parametrize("policy", ["round_robin", "least_flops"])
def test_round_robin_and_least_flops_are_placed_as_the_router_places_them(policy):
    """The simulator hands round robin a list of the workers that may have room and reuses the view by list
    identity; a plain Scheduler driven through ``acquire`` must place every request the same."""
    cal = h100_30b()
    stream = UnitStream(WorkloadConfig(requests=700, seed=5))
    cfg = SimConfig(workers=7, policy=policy, theta_flops=cal.flops.request_flops(0, 1500))
    sim, placed, result = run_traced(cfg, cal, stream)
    assert sim.frontend.scheduler.stats.queued > 100  # a backlog: workers fill up and free room in turn
    assert len(placed) == result.units
    assert replay(sim.frontend.trace, sim, offline_all_at_zero=True) == placed
