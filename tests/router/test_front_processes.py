"""``--front-processes N``: N front processes on one port in front of one placement owner.

Real router processes (``python -m sgl_moe.router``) in front of stand-in workers served from a thread of the test
process: the replay places a request stream exactly as the single-process router does; a request whose worker
fails it is handed to the owner, which retries it; the other routes and the client key work through the fronts;
a front that dies stops the router with exit status 1.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import msgspec
import psutil
import pytest
from doubles.stand_in import StandIn, ThreadServers, tokenizer_dir

from sgl_moe.harness.router_process import RouterProcess
from sgl_moe.policy_bench.standin import StandInFleet
from sgl_moe.router.placement.messages import Place, Refused, ToOwner, frame, place_keys
from sgl_moe.router.placement.owner import FrontSession, Screen
from sgl_moe.router.replicas import messages as replica_messages
from sgl_moe.router.replicas.messages import Requests
from sgl_moe.router.request.block_hash import PackedHashes


def test_packed_keys_cross_to_the_owner_as_little_endian_bytes_and_come_back_packed():
    """A front's ``Place`` carries each prompt's packed hashes (``PackedHashes``, what ``prompt_keys`` makes) as the
    bytes of their int64s, little-endian; the owner's ``place_keys`` gives the same hashes packed, and a list of ints
    (a replica's, a test's) as it was."""
    hashes = [1, -2, 2**63 - 1, -2**63, 0]
    msg = Place(7, "r", [80, 16, 3], [PackedHashes("q", hashes), [5, 6], []], 0, 1, b"fp")
    body = frame(msg)[4:]
    assert body.count(b"".join(h.to_bytes(8, "little", signed=True) for h in hashes)) == 1
    got = msgspec.msgpack.Decoder(ToOwner).decode(body)
    keys = place_keys(got)
    assert type(keys[0]) is PackedHashes and keys == [hashes, [5, 6], []]
    assert (got.req, got.rid, got.prompt_lens, got.fingerprint) == (7, "r", [80, 16, 3], b"fp")
    # A replica's requests to the placement owner carry the same ``Place`` through the broker.
    [through_broker] = replica_messages.decode(replica_messages.encode(Requests(1, "b", [msg]))).items
    assert through_broker == got and place_keys(through_broker) == [hashes, [5, 6], []]


def test_packed_keys_that_are_not_whole_int64s_are_refused_with_400_not_left_waiting():
    """Bytes that are not whole int64s pass msgspec's decoding (it checks only that they are bytes); the owner answers
    that request ``Refused`` 400 instead of leaving its front waiting, and places nothing."""
    placed = []

    class Owner:
        def screen(self, _fingerprint):
            return Screen("place")

        async def acquire(self, job):
            placed.append(job)

    class Outbox(list):
        def put(self, message):
            self.append(message)

    outbox = Outbox()
    session = FrontSession(Owner(), outbox, "front 0")
    asyncio.run(session._place(Place(3, "r", [40], [b"\x01" * 7], 0, 1, b"")))
    [refused] = outbox
    assert isinstance(refused, Refused) and (refused.req, refused.status) == (3, 400) and not placed
    assert "not a whole number of int64s" in refused.message


def _router(tmp_path: Path, name: str, urls: list[str], *args: str) -> RouterProcess:
    r = RouterProcess(log_path=tmp_path / f"{name}.log", worker_urls=urls, args=["--prefix-wait-s", "0", *args])
    r.start()
    r.wait_ready(timeout=90)
    return r


def _stream(n: int) -> list[str]:
    """Prompts over six shared instruction blocks of different lengths, each with a tail of its own."""
    blocks = [f"Rules {b}:\n" + "\n".join(f"{i}. Label the ticket by topic {b * 7 + i} and urgency." for i in
                                          range(4 + 6 * b)) for b in range(6)]
    order = [0, 1, 0, 2, 0, 1, 3, 0, 4, 1, 0, 5, 2, 0, 1, 3]
    return [f"{blocks[order[i % len(order)]]}\nTicket {i}: the printer on floor {i % 5} is out of toner.\nLabel:"
            for i in range(n)]


def _placements(router: RouterProcess, prompts: list[str]) -> list[tuple[str, str]]:
    """(worker id, predicted cached tokens) per prompt, sent one at a time. By id, not URL: ids follow the order
    the stand-ins joined in, which varies from start to start, and ties between idle workers go by id."""
    with httpx.Client(timeout=60) as c:
        out = []
        for text in prompts:
            r = c.post(f"{router.url}/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}})
            assert r.status_code == 200, r.text
            out.append((r.headers["x-sgl-moe-worker"], r.headers["x-sgl-moe-predicted-cached-tokens"]))
    return out


def test_replay_places_every_request_where_the_single_process_router_does(tmp_path):
    prompts = _stream(64)
    results = {}
    for fronts in ("1", "2"):  # fresh stand-ins each time: both routers start from empty caches
        with StandInFleet(3, 4096, per_token_s=0.0, step_s=0.0) as fleet:
            router = _router(tmp_path, f"fronts{fronts}", fleet.urls, "--front-processes", fronts)
            try:
                results[fronts] = _placements(router, prompts)
            finally:
                router.stop()
    single, fronted = results["1"], results["2"]
    assert len({w for w, _ in single}) > 1, "the stream should spread over workers, or the replay proves little"
    assert sum(int(c) > 0 for _, c in single) > len(prompts) // 2, "most requests should reuse a prefix"
    assert fronted == single


@pytest.fixture
def stand_ins(tmp_path):
    tok = tokenizer_dir(tmp_path / "tok", template=True)
    ins = [StandIn(tok, fail_status=500), StandIn(tok)]
    servers = ThreadServers([s.app() for s in ins])
    yield ins, servers.urls
    servers.stop()


def test_a_request_its_worker_failed_is_retried_by_the_owner_on_another(tmp_path, stand_ins):
    ins, urls = stand_ins
    router = _router(tmp_path, "retry", urls, "--front-processes", "2")
    try:
        with httpx.Client(timeout=60) as c:
            ids = {w["url"]: w["id"] for w in c.get(f"{router.url}/workers").json()["workers"]}
            for i in range(8):
                r = c.post(f"{router.url}/generate", json={"text": f"request {i} " * 30,
                                                           "sampling_params": {"max_new_tokens": 1}})
                assert r.status_code == 200, r.text
                assert r.headers["x-sgl-moe-worker"] == ids[urls[1]]
            metrics = c.get(f"{router.url}/metrics").text
    finally:
        router.stop()
    assert len(ins[0].received) >= 1, "some request should have been placed on the failing worker first"
    retries = [ln for ln in metrics.splitlines() if ln.startswith("sgl_moe_router_retries_total")]
    assert retries and float(retries[0].split()[-1]) == len(ins[0].received)


def test_other_routes_and_the_client_key_work_through_the_fronts(tmp_path, stand_ins):
    _, urls = stand_ins
    router = _router(tmp_path, "routes", urls[1:], "--front-processes", "2", "--api-key", "k1",
                     "--admin-api-key", "a1")
    try:
        with httpx.Client(timeout=60) as c:
            body = {"text": "hello " * 20, "sampling_params": {"max_new_tokens": 1}}
            assert c.post(f"{router.url}/generate", json=body).status_code == 401
            ok = c.post(f"{router.url}/generate", json=body, headers={"Authorization": "Bearer k1"})
            assert ok.status_code == 200, ok.text
            bad = c.post(f"{router.url}/generate", json={"text": 5}, headers={"Authorization": "Bearer k1"})
            assert bad.status_code == 400 and "text" in bad.text
            admin = {"Authorization": "Bearer a1"}
            workers = c.get(f"{router.url}/workers", headers=admin).json()["workers"]
            assert [w["url"] for w in workers] == urls[1:]
            assert c.post(f"{router.url}/workers", json={"nope": 1}, headers=admin).status_code == 400
            assert c.get(f"{router.url}/health").json()["healthy_workers"] == 1
            assert "sgl_moe_router_front_placements_total 1" in c.get(f"{router.url}/metrics", headers=admin).text
    finally:
        router.stop()


def test_a_front_that_dies_stops_the_router_with_status_1(tmp_path, stand_ins):
    _, urls = stand_ins
    router = _router(tmp_path, "dies", urls[1:], "--front-processes", "2")
    try:
        fronts = psutil.Process(router.proc.pid).children()
        fronts = [p for p in fronts if "multiprocessing.spawn" in " ".join(p.cmdline()) and
                  "resource_tracker" not in " ".join(p.cmdline())]
        assert len(fronts) == 2
        os.kill(fronts[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while router.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert router.proc.returncode == 1
        assert "front process" in router.log_text() and "exited" in router.log_text()
        assert not psutil.pid_exists(fronts[1].pid) or fronts[1].status() == psutil.STATUS_ZOMBIE
    finally:
        router.stop()


def test_requests_from_every_front_wait_in_the_owners_one_queue_and_a_leaving_client_leaves_it(tmp_path):
    """Θ pinned to one small request per worker and 0.4 s per step: 8 requests at once from 8 connections (the
    kernel spreads them over both fronts) run 2 at a time, the rest wait in the owner's queue, all answered.
    Then 6 clients that give up after 0.3 s: their queued requests leave the queue (``Cancel``), and the
    workers' in-flight load returns to 0."""
    one_request = "1"  # FLOPs: a worker takes a request only while its in-flight FLOPs are under Θ: one at a time
    with StandInFleet(2, 4096, per_token_s=0.0, step_s=0.4) as fleet:
        router = _router(tmp_path, "queue", fleet.urls, "--front-processes", "2", "--saturation-flops", one_request)
        try:
            async def burst(n: int, timeout: float) -> list:
                async def one(i: int):
                    async with httpx.AsyncClient(timeout=timeout) as c:  # a connection of its own
                        try:
                            return await c.post(f"{router.url}/generate", json={
                                "text": f"request {i} of the burst", "sampling_params": {"max_new_tokens": 1}})
                        except httpx.TimeoutException:
                            return None
                return await asyncio.gather(*(one(i) for i in range(n)))

            answers = asyncio.run(burst(8, 30))
            assert all(r is not None and r.status_code == 200 for r in answers), answers
            waited = [float(r.headers["x-sgl-moe-queue-ms"]) for r in answers]
            assert sum(w > 100 for w in waited) >= 4, waited  # 2 run per 0.4 s step; the rest queued

            gone = asyncio.run(burst(6, 0.3))
            assert sum(r is None for r in gone) >= 3, gone
            with httpx.Client(timeout=10) as c:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    health = c.get(f"{router.url}/health").json()
                    load = [w["inflight_flops"] for w in c.get(f"{router.url}/workers").json()["workers"]]
                    if health["queue_depth"] == 0 and load == [0.0, 0.0]:
                        break
                    time.sleep(0.2)
                assert health["queue_depth"] == 0 and load == [0.0, 0.0], (health, load)
                after = c.post(f"{router.url}/generate", json={"text": "after",
                                                               "sampling_params": {"max_new_tokens": 1}})
                assert after.status_code == 200
        finally:
            router.stop()


def test_a_streamed_answer_is_relayed_through_a_front(tmp_path, stand_ins):
    ins, urls = stand_ins
    router = _router(tmp_path, "stream", urls[1:], "--front-processes", "2")
    try:
        with httpx.Client(timeout=60) as c:
            with c.stream("POST", f"{router.url}/generate", json={"text": "stream me " * 10, "stream": True,
                                                                  "sampling_params": {"max_new_tokens": 2}}) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                body = b"".join(r.iter_raw())
        assert body == b'data: {"text": "x"}\n\n' + b"data: [DONE]\n\n"
        assert ins[1].received[-1][1]["stream"] is True
    finally:
        router.stop()
