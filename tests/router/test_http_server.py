"""``--http-server bare`` (the default): the proxied routes' common requests on bare protocols, the rest on aiohttp.

Real router processes (``python -m sgl_moe.router``) in front of stand-in workers served from a thread of the test
process. The bare side answers as aiohttp's server does (status, body, the router's headers, placements); every
request it does not serve is handed to aiohttp with its bytes as they arrived (other routes and methods, chunked
bodies, streamed answers, pipelined requests, bad heads, a missing key); it keeps aiohttp's timing rules (a slow
head is cut off, a slow body is answered 408) and a client that leaves has its request aborted on the worker.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from doubles.stand_in import StandIn, ThreadServers, tokenizer_dir

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.harness.router_process import RouterProcess

ONE = {"sampling_params": {"max_new_tokens": 1}}


def _router(tmp_path: Path, name: str, urls: list[str], *args: str) -> RouterProcess:
    r = RouterProcess(log_path=tmp_path / f"{name}.log", worker_urls=urls, args=["--prefix-wait-s", "0", *args])
    r.start()
    r.wait_ready(timeout=90)
    return r


def _counts(router: RouterProcess) -> dict[str, float]:
    """The bare side's counters from ``/metrics``: ``answered`` and each ``handed_off`` reason."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{router.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("sgl_moe_router_http_bare_answered_total"):
            out["answered"] = float(line.split()[-1])
        elif line.startswith("sgl_moe_router_http_handed_off_total"):
            out[line.split('reason="')[1].split('"')[0]] = float(line.split()[-1])
    return out


def _raw(port: int, data: bytes, wait_s: float = 1.0) -> bytes:
    """What the router sends back on one connection for ``data``, until it closes or ``wait_s`` passes quietly."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            pass
        return got


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n%s\r\n" % (path.encode(), len(body), extra) + body


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[StandIn], ThreadServers]]:
    tok = tokenizer_dir(tmp_path_factory.mktemp("tok"), template=True)
    ins = [StandIn(tok), StandIn(tok)]
    servers = ThreadServers([s.app() for s in ins])
    yield ins, servers
    servers.stop()


def _exchange(router: RouterProcess) -> list[tuple]:
    """A mixed sequence of hot requests, each answered on a fresh connection: what came back."""
    rules = "Rules:\n" + "\n".join(f"{i}. Label the ticket by topic {i}." for i in range(30))
    bodies = [{"text": f"{rules}\nTicket {i}: printer {i % 3} is out of toner.\nLabel:", **ONE} for i in range(8)]
    bodies += [{"text": 5}, {"text": "x", "sampling_params": {"n": 10_000}}, {"input_ids": [[1, 2], []]}]
    out = []
    for body in bodies:
        r = httpx.post(f"{router.url}/generate", json=body, timeout=30)
        out.append((r.status_code, r.headers.get("content-type"), r.headers.get("x-sgl-moe-worker"),
                    r.headers.get("x-sgl-moe-predicted-cached-tokens"), r.text if r.status_code >= 400 else r.json()))
    for model in (str(DEFAULT_MODEL_DIR), "no-such-model"):
        r = httpx.post(f"{router.url}/v1/completions", json={"model": model, "prompt": "hello there", "max_tokens": 1},
                       timeout=30)
        out.append((r.status_code, r.json()))
    return out


def test_hot_requests_get_the_answers_aiohttp_gives(tmp_path, stand_ins):
    ins, servers = stand_ins
    seen = {}
    for mode in ("bare", "aiohttp"):
        router = _router(tmp_path, mode, servers.urls, "--http-server", mode)
        try:
            seen[mode] = _exchange(router)
            counts = _counts(router)
        finally:
            router.stop()
        if mode == "bare":
            assert counts.get("answered") == len(seen[mode]), counts  # not handed to aiohttp after all
        else:
            assert counts == {}
    assert [s[0] for s in seen["bare"]] == [200] * 8 + [400] * 3 + [200, 404]
    assert seen["bare"] == seen["aiohttp"]


def test_what_the_bare_side_does_not_serve_goes_to_aiohttp_unchanged(tmp_path, stand_ins):
    ins, servers = stand_ins
    router = _router(tmp_path, "handoff", servers.urls)
    try:
        url = router.url
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        assert httpx.get(f"{url}/generate", timeout=30).status_code == 405
        r = httpx.post(f"{url}/generate?x=1", json={"text": "hello", **ONE}, timeout=30)
        assert r.status_code == 200 and r.headers["x-sgl-moe-worker"]

        def chunked():
            yield json.dumps({"text": "hello there", **ONE}).encode()
        r = httpx.post(f"{url}/generate", content=chunked(), timeout=30)
        assert r.status_code == 200 and r.headers["x-sgl-moe-worker"]

        for body in (b'{"text": "tell me", "stream": true}', b'{"text": "tell me", "\\u0073tream": true}'):
            raw = _raw(router.port, _post("/generate", body, b"Connection: close\r\n"), wait_s=10)
            assert b"text/event-stream" in raw and b"data: [DONE]" in raw and raw.endswith(b"0\r\n\r\n"), raw[:300]

        one = json.dumps({"text": "a b c", **ONE}).encode()
        raw = _raw(router.port, _post("/generate", one) * 3)
        assert raw.count(b"HTTP/1.1 200 OK") == 3, raw[:300]

        raw = _raw(router.port, b"POST /generate HTTP/1.1\r\nContent-Length: zz\r\n\r\n")
        assert raw.startswith(b"HTTP/1.0 400") or raw.startswith(b"HTTP/1.1 400"), raw[:200]

        counts = _counts(router)
        for why in ("route", "body", "stream", "pipelined", "bad_head"):
            assert counts.get(why, 0) >= 1, (why, counts)
        assert counts["stream"] == 2
    finally:
        router.stop()


def test_a_connection_is_served_until_it_closes_and_keeps_aiohttps_timeouts(tmp_path, stand_ins):
    ins, servers = stand_ins
    router = _router(tmp_path, "timeouts", servers.urls, "--header-timeout-s", "1", "--body-timeout-s", "1")
    try:
        with httpx.Client(timeout=30) as c:  # one kept-alive connection
            for i in range(5):
                assert c.post(f"{router.url}/generate", json={"text": f"request {i}", **ONE}).status_code == 200
        assert _counts(router)["answered"] == 5

        one = json.dumps({"text": "a b c", **ONE}).encode()
        raw = _raw(router.port, _post("/generate", one, b"Connection: close\r\n"), wait_s=5)
        assert raw.startswith(b"HTTP/1.1 200") and b"Connection: close" in raw

        t0 = time.monotonic()
        raw = _raw(router.port, _post("/generate", one)[:-5], wait_s=5)  # the body's last bytes never come
        assert raw.startswith(b"HTTP/1.1 408") and b"--body-timeout-s" in raw, raw[:300]
        assert 0.9 < time.monotonic() - t0 < 4

        t0 = time.monotonic()
        assert _raw(router.port, b"POST /generate HTTP/1.1\r\nHost:", wait_s=5) == b""  # closed, nothing said
        assert 0.9 < time.monotonic() - t0 < 4
    finally:
        router.stop()


@contextmanager
def _behind_a_slow_worker(tmp_path: Path, name: str, delay_s: float) -> Iterator[tuple[StandIn, RouterProcess]]:
    """A router in front of one stand-in that holds each request ``delay_s`` before answering."""
    slow = StandIn(tokenizer_dir(tmp_path / "tok", template=False), delay_s=delay_s)
    servers = ThreadServers([slow.app()])
    router = _router(tmp_path, name, servers.urls)
    try:
        yield slow, router
    finally:
        router.stop()
        servers.stop()


def _until(done: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_client_that_leaves_has_its_request_aborted_on_the_worker(tmp_path):
    with _behind_a_slow_worker(tmp_path, "leave", 5.0) as (slow, router):
        body = json.dumps({"text": "a long question", **ONE}).encode()
        with socket.create_connection(("127.0.0.1", router.port)) as s:
            s.sendall(_post("/generate", body))
            _until(lambda: slow.received)
        _until(lambda: slow.aborted)
        assert slow.aborted == [slow.received[0][1]["rid"]]
        assert _counts(router)["answered"] == 0


def test_a_client_sending_much_while_its_request_runs_is_paused_then_served_by_aiohttp(tmp_path):
    """3 MiB pipelined behind a request still running: the bare side stops reading past a request's worth, and the
    connection, handed to aiohttp once the first answer is out, reads and answers the rest."""
    with _behind_a_slow_worker(tmp_path, "paused", 2.0) as (slow, router):
        first = json.dumps({"text": "a question", **ONE}).encode()
        big = json.dumps({"input_ids": [7] * 1_000_000, **ONE}).encode()  # ~3 MiB, more than the bare side reads
        with socket.create_connection(("127.0.0.1", router.port), timeout=30) as s:
            s.sendall(_post("/generate", first))
            _until(lambda: slow.received)  # the first is running on the worker
            s.sendall(_post("/generate", big, b"Connection: close\r\n"))
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
        assert raw.startswith(b"HTTP/1.1 200") and raw.count(b"HTTP/1.1 ") == 2, raw[:500]
        counts = _counts(router)
        assert counts["answered"] == 1 and counts["pipelined"] == 1, counts


def test_the_client_key_is_checked_on_the_bare_side_too(tmp_path, stand_ins):
    ins, servers = stand_ins
    router = _router(tmp_path, "key", servers.urls, "--api-key", "k1", "--admin-api-key", "a1")
    try:
        body = {"text": "hello", **ONE}
        r = httpx.post(f"{router.url}/generate", json=body, timeout=30)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        for key in ("k1", "a1"):
            r = httpx.post(f"{router.url}/generate", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
            assert r.status_code == 200
        counts = _counts(router)
        assert counts["answered"] == 2 and counts["key"] == 1
    finally:
        router.stop()
