"""Router replicas in the simulator (``SimConfig.replicas``): N copies of the router in front of the same engines,
alone or sharing state through the router's own replica messages and ``PeerTables`` after a delay."""

import pytest

from sgl_moe.simulator import h100_30b
from sgl_moe.simulator.replica_frontends import ReplicaFrontends
from sgl_moe.simulator.simulation import SimConfig, Simulation
from sgl_moe.simulator.units import UnitStream
from sgl_moe.workloads import WorkloadConfig


def run(**kw):
    cfg = SimConfig(workers=4, policy="longest_block_match", arrival="open", rate=200.0, **kw)
    sim = Simulation(cfg, h100_30b(), UnitStream(WorkloadConfig(requests=600, seed=2)))
    return sim, sim.run()


def test_replicas_serve_the_same_stream_alone_or_sharing():
    one = run()[1]
    alone_sim, alone = run(replicas=2, replicas_share=False)
    shared_sim, shared = run(replicas=2, replica_delay_s=0.002)
    assert one.units == alone.units == shared.units > 600  # (600 tasks: the multi-selection ones are several)
    assert one.prompt_tokens == alone.prompt_tokens == shared.prompt_tokens
    assert isinstance(shared_sim.frontend, ReplicaFrontends) and len(shared_sim.frontend.replicas) == 2
    assert alone.extra["peer_messages"] == 0 and shared.extra["peer_messages"] > shared.units
    assert shared.extra["replicas"] == 2 and shared.extra["replicas_share"] and not alone.extra["replicas_share"]
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
