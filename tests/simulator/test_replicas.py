"""Router replicas in the simulator (``SimConfig.replicas``): N copies of the router in front of the same engines,
alone or sharing state through the router's own replica messages and ``PeerTables`` after a delay."""

import pytest

from sgl_moe.simulator import h100_30b
from sgl_moe.simulator.replica_frontends import OwnerPlacement, ReplicaFrontends
from sgl_moe.simulator.simulation import SimConfig, Simulation
from sgl_moe.simulator.units import UnitStream
from sgl_moe.workloads import WorkloadConfig


def run(**kw):
    cfg = SimConfig(**{"workers": 4, "policy": "longest_block_match", "arrival": "open", "rate": 200.0, **kw})
    sim = Simulation(cfg, h100_30b(), UnitStream(WorkloadConfig(requests=600, seed=2)))
    return sim, sim.run()


def test_replicas_serve_the_same_stream_alone_or_sharing():
    one = run()[1]
    alone_sim, alone = run(replicas=2, replicas_share=False)
    shared_sim, shared = run(replicas=2, replica_placement="shared", replica_delay_s=0.002)
    assert one.units == alone.units == shared.units > 600  # (600 tasks: the multi-selection ones are several)
    assert one.prompt_tokens == alone.prompt_tokens == shared.prompt_tokens
    assert isinstance(shared_sim.frontend, ReplicaFrontends) and len(shared_sim.frontend.replicas) == 2
    assert alone.extra["peer_messages"] == 0 and shared.extra["peer_messages"] > shared.units
    assert shared.extra["replicas"] == 2 and shared.extra["replicas_share"] and not alone.extra["replicas_share"]
    assert shared.extra["replica_placement"] == "shared" and alone.extra["replica_placement"] == "alone"
    # Each replica's tables heard the other's promises and load, in order.
    f = shared_sim.frontend
    for t in f.tables:
        (peer,) = t.peers.values()
        assert t.stats.batches > 100 and t.stats.promises_applied > 100 and t.stats.gaps == 0
        assert not peer.promises or all(slot is not None for slot, _ in peer.promises.values())
    # Done: nothing in flight anywhere, so no replica still counts another's load on any worker.
    assert all(w.peer_flops == 0 and w.inflight_flops == 0 for r in f.replicas for w in r.pool.workers.values())


def test_true_load_counts_every_replicas_own_work():
    sim, result = run(replicas=2, replicas_share=False)
    # Alone, each replica admits up to Θ on a worker by itself: the true load when a request was placed can pass Θ
    # (one router keeps it below).
    assert result.max_load_before_admission > 1.0
    assert run()[1].max_load_before_admission < 1.0


def test_offline_runs_take_one_router():
    with pytest.raises(ValueError, match="closed or open"):
        SimConfig(workers=2, replicas=2).validate()


# -- one placement owner (replica_placement="owner", the router's default) ----------------------------------------

def test_owner_places_every_replicas_requests_through_one_scheduler():
    one = run()[1]
    sim, owner = run(replicas=4, replica_delay_s=0.002)
    f = sim.frontend
    assert isinstance(f, OwnerPlacement) and f.count == 4
    assert owner.extra["replica_placement"] == "owner" and owner.extra["replicas"] == 4
    assert owner.units == one.units and owner.prompt_tokens == one.prompt_tokens and owner.rejected == 0
    # one scheduler saw every request: its own and the three other replicas' (three quarters, round-robin)
    assert f.owner.scheduler.stats.dispatched == owner.units
    assert abs(owner.extra["remote_placed"] - owner.units * 3 / 4) <= 1
    assert owner.extra["peer_messages"] == 3 * owner.extra["remote_placed"]  # Place, Placed, Release each
    assert all(w.inflight_flops == 0 and w.inflight_requests == 0 for w in f.owner.pool.workers.values())
    # the default, as the router's
    assert SimConfig().replica_placement == "owner"


def test_owner_keeps_theta_as_one_router_does():
    one = run()[1]
    owner = run(replicas=4, replica_delay_s=0.002)[1]
    shared = run(replicas=4, replica_placement="shared", replica_delay_s=0.002)[1]
    alone = run(replicas=4, replicas_share=False)[1]
    # one router never places on a worker at Θ; nor does the owner, whichever replica took the request
    assert one.max_load_before_admission < 1.0 and owner.max_load_before_admission < 1.0
    assert owner.extra["max_true_load_past_theta_flops"] == 0.0
    assert shared.max_load_before_admission > 1.0 and alone.max_load_before_admission > 1.0
    # and it reuses the cache as one router does, not as replicas each placing their own
    assert owner.cached_fraction > max(shared.cached_fraction, alone.cached_fraction) + 0.05
    assert abs(owner.cached_fraction - one.cached_fraction) < 0.05


def test_owner_without_delay_is_one_router():
    one = run()[1]
    owner = run(replicas=3, replica_delay_s=0.0)[1]
    keys = ("units", "cached_tokens", "latency_p50_s", "latency_p99_s", "sim_seconds", "spills",
            "max_load_before_admission")
    assert {k: getattr(owner, k) for k in keys} == {k: getattr(one, k) for k in keys}


def test_owner_delay_shows_in_latency():
    sim, slow = run(replicas=2, replica_delay_s=0.1)
    fast_sim, fast = run(replicas=2, replica_delay_s=0.001)
    # half the requests wait for Place and Placed (0.2 s) before their worker sees them: 0.1 s more on average
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(sim._latencies) > mean(fast_sim._latencies) + 0.08
    assert slow.latency_p50_s > fast.latency_p50_s and slow.latency_p99_s > fast.latency_p99_s + 0.1
    assert min(sim._latencies) < 0.2 < max(sim._latencies)  # the owner's own requests pay no delay


def test_owner_memo_changes_nothing_but_speed():
    results = {}
    for memo in (True, False):
        sim = Simulation(SimConfig(workers=6, policy="longest_block_match", arrival="closed", concurrency=60,
                                   replicas=3, replica_delay_s=0.003, memo=memo),
                         h100_30b(), UnitStream(WorkloadConfig(requests=800, seed=5)))
        order = []
        deliver = sim.frontend.owner._on_placed

        def record(p, deliver=deliver, order=order):
            order.append((p.job.rid, p.worker.id, p.cost))
            deliver(p)

        sim.frontend.owner._on_placed = record
        r = sim.run()
        results[memo] = (order, r.cached_tokens, r.latency_p99_s, r.sim_seconds)
    assert results[True] == results[False]


def test_owner_queue_full_refuses_after_a_delay_and_the_client_retries():
    sim, r = run(replicas=2, replica_delay_s=0.01, queue_size=2, rate=2000.0)
    assert r.rejected > 0 and r.extra["refused_late"] > 0  # refused at the owner after Place travelled
    assert r.units + r.rejected > 600
    cfg = SimConfig(workers=2, policy="longest_block_match", arrival="closed", concurrency=40, queue_size=2,
                    replicas=2, replica_delay_s=0.01, theta_flops=h100_30b().flops.request_flops(0, 500))
    closed = Simulation(cfg, h100_30b(), UnitStream(WorkloadConfig(requests=100, seed=2))).run()
    # every refused request came back after Retry-After and was served
    assert closed.extra["refused_late"] > 0 and closed.units == 100 and closed.rejected >= closed.extra["refused_late"]
