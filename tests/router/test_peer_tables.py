"""Router replicas (``--peers``): another replica's promises and load folded into this router's tables, on the real
scheduler, block index and pending ledger (the broker itself is in tests/router/test_replicas_live.py)."""

from __future__ import annotations

import pytest

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.scheduler import Scheduler
from sgl_moe.router.replicas.messages import (
    VERSION,
    Batch,
    Bye,
    Hello,
    Load,
    Promised,
    Retired,
    Snapshot,
    decode,
    encode,
)
from sgl_moe.router.replicas.peer_tables import PeerTables
from tests.router.test_placement_rules import FLOPS, INFO, Clock, Pool, job

THETA = 1e9


class Replica:
    """One router's tables and scheduler, with the peers' share folded in as the router does (``_start_peers``)."""

    def __init__(self, workers: int = 2) -> None:
        self.index = BlockIndex()
        self.pool = Pool(self.index, workers, theta=THETA)
        self.clock = Clock()
        self.ledger = PendingLedger(self.index, ttl_s=10)
        cfg = RouterConfig(prefix_wait_s=0.0, prefix_homes=False)
        self.sched = Scheduler(cfg, self.pool, self.index, self.ledger, clock=self.clock)
        by_url = {w.url: w for w in self.pool.workers.values()}
        self.tables = PeerTables(
            index=self.index, slot_of=lambda url, rank: by_url[url].slots.get(rank) if url in by_url else None,
            set_peer_load=lambda url, f: self.sched.set_peer_load(by_url[url], f) if url in by_url else None,
            timeout_s=5.0, clock=self.clock)

    def place(self, rid: str, blocks: list[int]):
        return self.sched.try_place(job(rid, blocks))


def test_a_promise_made_through_another_replica_is_matched_here():
    b = Replica()
    w0, w1 = b.pool.workers["w0"], b.pool.workers["w1"]
    b.sched.set_peer_load(w0, 0.1 * THETA)  # w0 busier: without the promise a new prefix would go to w1
    assert b.tables.apply_batch("a", 0, []) is False  # not synced yet: ask for a snapshot
    b.tables.apply_snapshot("a", 1, [Promised(7, "http://w0", 0, [11, 12, 13])], Load({}, 0))
    placed = b.place("r1", [11, 12, 13, 14])
    assert placed.worker is w0 and placed.matched_blocks == 3
    b.sched.release(placed, ok=False)
    assert b.tables.apply_batch("a", 2, [Retired(7)]) is True
    placed = b.place("r2", [11, 12, 13, 15])
    assert placed.worker is w1 and placed.matched_blocks == 0  # the promise is gone, the load decides
    assert b.index.sizes(w0.slots[0]) == (0, 0)


def test_the_other_replicas_load_counts_in_admission_and_survives_this_routers_releases():
    b = Replica()
    w0, w1 = b.pool.workers["w0"], b.pool.workers["w1"]
    b.tables.apply_snapshot("a", 1, [], Load({"http://w0": THETA, "http://w1": 0.5 * THETA}, 3))
    assert (w0.peer_flops, w0.inflight_flops, w0.admissible) == (THETA, THETA, False)
    placed = b.place("r1", [1, 2])
    assert placed.worker is w1  # w0 is at Θ with another replica's work
    b.tables.apply_batch("c", 0, [])
    b.tables.apply_snapshot("c", 1, [], Load({"http://w1": 0.25 * THETA}, 0))
    assert w1.peer_flops == pytest.approx(0.75 * THETA)  # the sum over replicas
    b.sched.release(placed, ok=True)
    assert w1.inflight_flops == w1.peer_flops  # idle here: exactly the peers' share, no residue
    b.tables.apply_batch("a", 2, [Load({}, 0)])
    assert (w0.peer_flops, w0.inflight_flops) == (0.0, 0.0) and w0.admissible
    assert b.tables.describe()["a"]["queued"] == 0 and b.tables.describe()["c"]["synced"]


def test_a_gap_asks_for_a_snapshot_and_the_snapshot_replaces_the_state():
    b = Replica()
    slot = b.pool.workers["w0"].slots[0]
    b.tables.apply_snapshot("a", 5, [Promised(1, "http://w0", 0, [1, 2]), Promised(2, "http://w0", 0, [3])],
                            Load({}, 0))
    assert b.tables.apply_batch("a", 6, [Promised(3, "http://w0", 0, [4])]) is True
    assert b.tables.apply_batch("a", 9, []) is False and b.tables.stats.gaps == 1  # 7 and 8 were lost
    b.tables.apply_snapshot("a", 10, [Promised(2, "http://w0", 0, [3]), Promised(4, "http://w0", 0, [5])],
                            Load({}, 0))
    assert b.index.sizes(slot) == (0, 2)  # 1 and 3 retired by the snapshot, 2 kept, 4 added
    assert set(b.tables.peers["a"].promises) == {2, 4}


def test_a_silent_replica_expires_and_a_stopped_one_leaves_at_once():
    b = Replica()
    w0 = b.pool.workers["w0"]
    b.tables.apply_snapshot("a", 1, [Promised(1, "http://w0", 0, [1, 2])], Load({"http://w0": 0.5 * THETA}, 0))
    b.tables.apply_snapshot("c", 1, [Promised(1, "http://w0", 0, [3])], Load({"http://w0": 0.25 * THETA}, 0))
    b.clock.t += 3.0
    b.tables.apply_batch("c", 2, [])  # c keeps talking, a went silent
    b.clock.t += 3.0
    assert b.tables.expire() == ["a"]
    assert w0.peer_flops == pytest.approx(0.25 * THETA) and b.index.sizes(w0.slots[0]) == (0, 1)
    b.tables.drop("c", "it stopped")
    assert w0.peer_flops == 0.0 and w0.inflight_flops == 0.0 and b.index.sizes(w0.slots[0]) == (0, 0)


def test_a_promise_for_a_worker_not_here_yet_applies_when_it_joins():
    b = Replica(workers=1)
    b.tables.apply_snapshot("a", 1, [Promised(1, "http://w9", 0, [1, 2])], Load({}, 0))
    assert b.tables.stats.promises_unknown_worker == 1 and b.tables.resolve() == 0
    w9 = Worker(id="w9", url="http://w9", info=INFO, flops=FLOPS, theta=THETA, theta_source="test",
                slots={0: b.index.add_target()})
    b.pool.workers["w9"] = w9
    b.tables.slot_of = lambda url, rank: w9.slots[rank] if url == "http://w9" else None
    assert b.tables.resolve() == 1 and b.index.sizes(w9.slots[0]) == (0, 2)
    b.tables.apply_batch("a", 2, [Retired(1)])
    assert b.index.sizes(w9.slots[0]) == (0, 0)


def test_this_routers_promises_and_retirements_reach_the_observer():
    b = Replica()
    seen = []

    class Observer:
        def promised(self, p):
            seen.append(("promised", p.serial, p.keys))

        def retired(self, p):
            seen.append(("retired", p.serial))

    b.ledger.observer = Observer()
    first = b.place("r1", [1, 2])
    second = b.place("r2", [5, 6])
    b.sched.release(first, ok=False)  # failed: retired at once
    b.sched.release(second, ok=True)  # completed, not yet stored: retired when stored (or by the TTL)
    assert seen == [("promised", 0, [1, 2]), ("promised", 1, [5, 6]), ("retired", 0)]
    b.ledger.on_stored(second.slot, b.index.store(second.slot, [5, 6]))
    assert seen[-1] == ("retired", 1)


def test_messages_are_typed_and_versioned():
    batch = Batch(VERSION, "a", 3, [Promised(1, "http://w0", 0, [-5, 2**62]), Retired(1), Load({"http://w0": 1e9}, 2)])
    for m in (batch, Hello(VERSION, "a"), Bye(VERSION, "a"),
              Snapshot(VERSION, "a", 4, [Promised(2, "http://w1", 1, [7])], Load({}, 0), 1.7e9)):
        assert decode(encode(m)) == m
    with pytest.raises(ValueError):
        decode(b"\x93\x01\x02\x03")
