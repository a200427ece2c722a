"""Two router replicas (``--peers``) sharing pending blocks and load through a real ``nats-server`` (token auth), in
front of the same stand-in workers served from the test process: a request routed by one replica is seen by the
other while it runs (its promised blocks matched, its FLOPs counted), and is gone from it when done; with the broker
killed each replica keeps serving and says so, and with the broker back they share state again."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sgl_moe.harness.router_process import RouterProcess
from sgl_moe.harness.worker_process import free_port
from sgl_moe.policy_bench.standin import StandInFleet

TOKEN = "test-peers-token"


REPO = Path(__file__).resolve().parents[2]


class NatsServer:
    """The broker as the README starts it: ``bash tools/nats_server.sh PORT`` with ``$SGL_MOE_PEERS_TOKEN`` set."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> NatsServer:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(["bash", str(REPO / "tools" / "nats_server.sh"), str(self.port)],
                                         stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "SGL_MOE_PEERS_TOKEN": TOKEN})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"nats-server did not listen on {self.port}: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # the script exec'd nats-server: this is the broker itself
            self.proc.wait(10)


def workers(router: RouterProcess) -> dict:
    return httpx.get(f"{router.url}/workers", timeout=10).json()


def wait_for(what: str, check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.1)


def by_url(view: dict) -> dict[str, dict]:
    return {w["url"]: w for w in view["workers"]}


def prompt(tail: str) -> str:
    rules = "\n".join(f"{i}. Label the ticket by its topic {i} and its urgency, in one word." for i in range(24))
    return f"Rules:\n{rules}\nTicket: {tail}\nLabel:"


def start_cluster(tmp_path, placement: str):
    port = free_port("127.0.0.1")
    broker = NatsServer(port, tmp_path / "nats.log").start()
    # Slow stand-ins (about 1.5 s per 500-token prompt) keep a request in flight long enough to look at it.
    fleet = StandInFleet(2, 8192, per_token_s=3e-3, step_s=0.0).start()
    routers = []
    try:
        for name in ("a", "b"):  # a starts first: with one placement owner, it is a
            r = RouterProcess(log_path=tmp_path / f"router-{name}.log", worker_urls=fleet.urls,
                              args=["--peers", f"nats://127.0.0.1:{port}", "--peers-token", TOKEN,
                                    "--replica-name", name, "--peer-heartbeat-s", "0.2", "--peer-timeout-s", "2",
                                    "--replica-placement", placement])
            routers.append(r)
            r.start()
            r.wait_ready(timeout=90)
    except BaseException:
        stop_cluster(broker, fleet, routers)
        raise
    return broker, fleet, routers


def stop_cluster(broker, fleet, routers) -> None:
    for r in routers:
        r.stop()
    fleet.stop()
    broker.kill()


@pytest.fixture
def cluster(tmp_path):
    parts = start_cluster(tmp_path, "shared")
    yield parts
    stop_cluster(*parts)


@pytest.fixture
def owned_cluster(tmp_path):
    parts = start_cluster(tmp_path, "owner")
    yield parts
    stop_cluster(*parts)


def wait_synced(a: RouterProcess, b: RouterProcess) -> None:
    for me, other in ((a, "b"), (b, "a")):
        wait_for(f"{me.url} connected and synced with {other}",
                 lambda me=me, other=other: workers(me)["peers"]["state"] == "connected"
                 and workers(me)["peers"]["replicas"].get(other, {}).get("synced"))
    wait_for("both healthy once they hold each other's state",
             lambda: all(httpx.get(f"{r.url}/health", timeout=5).status_code == 200 for r in (a, b)))


def test_replicas_share_promised_blocks_and_load_and_survive_the_broker(cluster, tmp_path):
    broker, fleet, (a, b) = cluster
    wait_synced(a, b)
    assert workers(a)["peers"]["broker"] == f"nats://127.0.0.1:{broker.port}"  # no token in it
    assert workers(a)["peers"]["placement"] == "shared tables"

    body = {"text": prompt("the printer on floor 3 is out of toner"), "sampling_params": {"max_new_tokens": 1}}
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, f"{a.url}/generate", json=body, timeout=60)
        # While it runs on the worker A chose, B sees its promised blocks and its FLOPs there.
        busy = wait_for("B sees A's request", lambda: next(
            (u for u, w in by_url(workers(b)).items() if w["peer_inflight_flops"] > 0 and w["pending_blocks"] > 0),
            None))
        follower = httpx.post(f"{b.url}/generate", timeout=60, json={
            "text": prompt("the badge reader at the north door beeps"), "sampling_params": {"max_new_tokens": 1}})
        r1 = first.result()
    assert r1.status_code == 200 and follower.status_code == 200, (r1.text, follower.text)
    a_ids = {w["id"]: w["url"] for w in workers(a)["workers"]}
    b_ids = {w["id"]: w["url"] for w in workers(b)["workers"]}
    assert a_ids[r1.headers["x-sgl-moe-worker"]] == busy
    # B placed the follower on the worker computing the shared prefix for A's request, and counted it as cached.
    assert b_ids[follower.headers["x-sgl-moe-worker"]] == busy
    assert int(follower.headers["x-sgl-moe-predicted-cached-tokens"]) >= 256
    # Done on A: its load leaves B's view (its blocks stay until stored or its TTL: the stand-ins send no events).
    wait_for("A's load gone from B", lambda: all(w["peer_inflight_flops"] == 0 for w in workers(b)["workers"]))

    broker.kill()
    wait_for("A says the broker is unreachable", lambda: workers(a)["peers"]["state"] == "unreachable")
    alone = httpx.post(f"{a.url}/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 1}},
                       timeout=60)
    assert alone.status_code == 200, alone.text
    wait_for("B dropped A once its heartbeats stopped", lambda: "a" not in workers(b)["peers"]["replicas"])
    metrics = httpx.get(f"{a.url}/metrics", timeout=10).text
    assert "sgl_moe_router_peers_connected 0.0" in metrics

    again = NatsServer(broker.port, tmp_path / "nats2.log").start()
    try:
        for me, other in ((a, "b"), (b, "a")):
            wait_for(f"{me.url} reconnected and synced with {other}",
                     lambda me=me, other=other: workers(me)["peers"]["state"] == "connected"
                     and workers(me)["peers"]["replicas"].get(other, {}).get("synced"), timeout=30)
    finally:
        again.kill()


def test_one_replica_places_for_both_and_the_other_takes_over_when_it_dies(owned_cluster):
    broker, fleet, (a, b) = owned_cluster
    wait_synced(a, b)
    for r in (a, b):
        assert workers(r)["peers"]["placement"]["owner"] == "a"  # up longest

    body = {"text": prompt("the printer on floor 3 is out of toner"), "sampling_params": {"max_new_tokens": 1}}
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, f"{b.url}/generate", json=body, timeout=60)
        # Sent to B, placed by A: A's own scheduler holds its FLOPs and promised blocks, as for its own requests.
        busy = wait_for("A holds B's request", lambda: next(
            (u for u, w in by_url(workers(a)).items() if w["inflight_requests"] == 1 and w["pending_blocks"] > 0
             and w["peer_inflight_flops"] == 0), None))
        assert all(w["inflight_requests"] == 0 for w in workers(b)["workers"])  # B reserved nothing itself
        follower = httpx.post(f"{a.url}/generate", timeout=60, json={
            "text": prompt("the badge reader at the north door beeps"), "sampling_params": {"max_new_tokens": 1}})
        r1 = first.result()
    assert r1.status_code == 200 and follower.status_code == 200, (r1.text, follower.text)
    b_ids = {w["id"]: w["url"] for w in workers(b)["workers"]}
    a_ids = {w["id"]: w["url"] for w in workers(a)["workers"]}
    assert b_ids[r1.headers["x-sgl-moe-worker"]] == busy
    assert a_ids[follower.headers["x-sgl-moe-worker"]] == busy  # A placed its own follower on B's prefix
    assert int(follower.headers["x-sgl-moe-predicted-cached-tokens"]) >= 256
    placing = workers(b)["peers"]["placement"]
    assert placing["remote_placed"] == 1 and placing["failovers"] == 0, placing
    assert workers(a)["peers"]["placement"]["placing_for"] == ["b"]
    wait_for("B's request released at A", lambda: all(w["inflight_requests"] == 0 for w in workers(a)["workers"]))

    # The owner dies: what B sends it meanwhile fails over to B's own tables once A's heartbeats stop.
    a.proc.kill()
    a.proc.wait(10)
    t0 = time.monotonic()
    late = httpx.post(f"{b.url}/generate", json=body, timeout=60)
    assert late.status_code == 200, late.text
    assert time.monotonic() - t0 < 10
    wait_for("B owns placement", lambda: workers(b)["peers"]["placement"]["owner"] == "b")
    again = httpx.post(f"{b.url}/generate", json=body, timeout=60)
    assert again.status_code == 200, again.text
    # Sent while B still took A for the owner (A expires after --peer-timeout-s 2): it waited, then failed over.
    assert workers(b)["peers"]["placement"]["failovers"] == 1
    assert "placement owner a gone" in b.log_text()


def test_a_wrong_token_leaves_the_router_serving_alone(tmp_path):
    port = free_port("127.0.0.1")
    broker = NatsServer(port, tmp_path / "nats.log").start()
    fleet = StandInFleet(1, 4096, per_token_s=0.0, step_s=0.0).start()
    r = RouterProcess(log_path=tmp_path / "router.log", worker_urls=fleet.urls,
                      args=["--peers", f"nats://127.0.0.1:{port}", "--peers-token", "not-the-token",
                            "--peer-timeout-s", "15"])
    try:
        r.start()
        r.wait_ready(timeout=90)
        wait_for("unreachable", lambda: workers(r)["peers"]["state"] == "unreachable")
        # Not healthy while it waits for the other replicas' state, then serving alone once --peer-timeout-s is over.
        health = httpx.get(f"{r.url}/health", timeout=5)
        assert health.status_code == 503 and "replicas" in health.json()["waiting_for"], health.text
        wait_for("healthy alone", lambda: httpx.get(f"{r.url}/health", timeout=5).status_code == 200, timeout=30)
        ok = httpx.post(f"{r.url}/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 1}},
                        timeout=60)
        assert ok.status_code == 200, ok.text
        assert "not-the-token" not in r.log_text()
    finally:
        r.stop()
        fleet.stop()
        broker.kill()

