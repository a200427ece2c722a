"""One placement owner among router replicas (``--replica-placement owner``): ``SharedPlacement`` on two replicas'
real schedulers, tables and ledgers, their messages handed straight to each other (msgpack round trip included)
instead of through the broker (that is tests/router/test_replicas_live.py)."""

from __future__ import annotations

import asyncio

import pytest

from sgl_moe.router.placement.owner import PlacementOwner, Screen
from sgl_moe.router.replicas.messages import decode, encode
from sgl_moe.router.replicas.shared_placement import Refusal, SharedPlacement
from tests.router.test_peer_tables import THETA, Replica
from tests.router.test_placement_rules import job


def refused(exc):
    from sgl_moe.router.front.service import _refused
    return _refused(exc)


class Node:
    def __init__(self, name: str, since: float, net: dict[str, Node]) -> None:
        self.r = Replica()
        self.name = name
        self.placed_here: list = []
        hooks = PlacementOwner(self.r.sched.acquire, self.r.sched.release, refused, lambda fp: (
            Screen("refuse", "poison") if fp == b"poison" else Screen("place")), self.placed_here.append,
            lambda: None)
        self.net = net
        self.peers: dict[str, float] = {}
        self.up = True
        self.placing = SharedPlacement(name=name, since=since, owner=hooks, send=self._send,
                                       peers_since=lambda: dict(self.peers), connected=lambda: self.up,
                                       answer_timeout_s=0.5)
        net[name] = self

    def _send(self, to: str, message) -> None:
        m = decode(encode(message))  # what the broker would carry
        target = self.net.get(to)
        if target is None:
            return  # gone: nobody answers
        loop = asyncio.get_running_loop()
        if type(m).__name__ == "Requests":
            loop.call_soon(target.placing.on_requests, m.replica, m.items)
        else:
            loop.call_soon(target.placing.on_answers, m.replica, m.items)

    def worker_at(self, url: str):
        return next((w for w in self.r.pool.workers.values() if w.url == url), None)

    async def acquire(self, rid: str, blocks: list[int], fingerprint: bytes = b""):
        return await self.placing.acquire(job(rid, blocks), fingerprint, self.worker_at, self.r.sched.acquire)


def pair() -> tuple[Node, Node]:
    net: dict[str, Node] = {}
    a, b = Node("a", 100.0, net), Node("b", 200.0, net)
    a.peers["b"], b.peers["a"] = 200.0, 100.0
    return a, b


def test_the_replica_up_longest_owns_placement_and_an_unsynced_peer_never_does():
    a, b = pair()
    assert a.placing.owner_name() == b.placing.owner_name() == "a"
    b.peers["a"] = float("inf")  # no snapshot of a yet: b knows no older replica
    assert b.placing.owner_name() == "b"
    b.peers["c"] = 150.0  # up longer than b
    assert b.placing.owner_name() == "c"
    b.peers["a"] = 150.0  # a tie on start time goes by name
    assert b.placing.owner_name() == "a"


def test_requests_through_either_replica_share_one_scheduler():
    async def body():
        a, b = pair()
        first = await b.acquire("r1", [1, 2, 3])
        # b reserved nothing; a holds the request as its own: FLOPs and promised blocks.
        assert all(w.inflight_requests == 0 for w in b.r.pool.workers.values())
        owner_w = a.r.pool.workers[first.worker.id]
        assert owner_w.inflight_requests == 1 and first.settle is not None
        follower = await a.acquire("r2", [1, 2, 3, 4])
        assert follower.worker is owner_w and follower.matched_blocks == 3  # b's request's pending blocks
        assert len(a.placed_here) == 1 and b.placing.remote_placed == 1  # observed: the one a placed for b
        first.settle(True)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert owner_w.inflight_requests == 1  # b's released at a; a's own still runs
        a.r.sched.release(follower, ok=True)
        assert owner_w.inflight_requests == 0

    asyncio.run(body())


def test_the_owner_queue_is_one_queue_and_refusals_come_back():
    async def body():
        a, b = pair()
        for w in a.r.pool.workers.values():  # every worker at Θ: a's queue takes b's request
            a.r.sched.set_peer_load(w, THETA)
        waiting = asyncio.ensure_future(b.acquire("r1", [1, 2]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(a.r.sched.queue) == 1 and not waiting.done()
        w0 = a.r.pool.workers["w0"]
        a.r.sched.set_peer_load(w0, 0.0)
        a.r.sched.pump()
        placed = await asyncio.wait_for(waiting, 5)
        assert placed.worker.id == "w0"
        with pytest.raises(Refusal) as exc:
            await b.acquire("r2", [9], fingerprint=b"poison")
        assert exc.value.refused.status == 400

    asyncio.run(body())


def test_a_retry_places_here_and_a_gone_owner_fails_over():
    async def body():
        a, b = pair()
        retry = job("r1", [1, 2])
        retry.exclude = frozenset({"w0"})
        placed = await b.placing.acquire(retry, b"", b.worker_at, b.r.sched.acquire)
        assert placed.settle is None and placed.worker.id == "w1"  # b's own scheduler: the owner has no exclude
        b.r.sched.release(placed, ok=True)
        del b.net["a"]  # a dies: b's Place goes unanswered until a expires
        waiting = asyncio.ensure_future(b.acquire("r2", [5, 6]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()
        b.placing.peer_gone("a", "expired")
        placed = await asyncio.wait_for(waiting, 5)
        assert placed.settle is None and b.placing.failovers == 1
        # An owner restarted under the same name (it says Hello on joining) never answers what the old one was
        # asked: that fails over too.
        asked: list = []

        class Dying:  # takes the request, then dies before answering
            placing = type("P", (), {"on_requests": staticmethod(lambda _r, items: asked.extend(items))})

        b.net["a"] = Dying()
        waiting = asyncio.ensure_future(b.acquire("r3", [7, 8]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(asked) == 1 and not waiting.done()
        b.placing.peer_restarted("a")  # back, with nothing of what the old one was asked
        placed = await asyncio.wait_for(waiting, 5)
        assert placed.settle is None and b.placing.failovers == 2

    asyncio.run(body())


def test_a_replica_that_goes_away_or_rejoins_has_its_placements_released_at_the_owner():
    async def body():
        a, b = pair()
        p1 = await b.acquire("r1", [1, 2])
        w = a.r.pool.workers[p1.worker.id]
        assert w.inflight_requests == 1
        a.placing.peer_restarted("b")  # b said Hello again: what a holds for it is stale
        assert w.inflight_requests == 0
        p2 = await b.acquire("r2", [1, 2])
        assert a.r.pool.workers[p2.worker.id].inflight_requests == 1
        a.placing.peer_gone("b", "expired")
        assert all(x.inflight_requests == 0 for x in a.r.pool.workers.values())
        assert a.placing.sessions == {}

    asyncio.run(body())


def test_without_the_broker_or_without_an_answer_requests_are_placed_here():
    async def body():
        a, b = pair()
        b.up = False  # the broker is away: nothing sent would arrive
        placed = await b.acquire("r1", [1, 2])
        assert placed.settle is None and all(w.inflight_requests == 0 for w in a.r.pool.workers.values())
        b.r.sched.release(placed, ok=True)
        b.up = True
        asked: list = []

        class Deaf:  # the Place is lost on the way: the owner never answers
            placing = type("P", (), {"on_requests": staticmethod(lambda _r, items: asked.extend(items))})

        b.net["a"] = Deaf()
        placed = await asyncio.wait_for(b.acquire("r2", [3, 4]), 5)  # after answer_timeout_s (0.5 s)
        assert placed.settle is None and b.placing.failovers == 1
        await asyncio.sleep(0.01)
        assert [type(m).__name__ for m in asked] == ["Place", "Cancel"]  # the owner is told, should it be there

    asyncio.run(body())


@pytest.mark.parametrize(("kw", "message"), [
    ({"replica_name": "a b"}, "--replica-name"),
    ({"replica_name": "r>1"}, "--replica-name"),
    ({"peers": "nats://127.0.0.1:4222", "front_processes": 2}, "--replica-placement shared"),
])
def test_settings_that_cannot_work_are_refused_at_start(kw, message):
    from sgl_moe.router.config import RouterConfig

    with pytest.raises(ValueError, match=message):
        RouterConfig(**kw).validate()
    RouterConfig(peers="nats://127.0.0.1:4222", front_processes=2, replica_placement="shared").validate()
    RouterConfig(replica_name="host-1.r_0").validate()
