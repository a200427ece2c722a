"""``WorkerClient``: the router's HTTP/1.1 client to workers, against real local servers (aiohttp's, and raw sockets
for the misbehaving ones)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from sgl_moe.router.errors import WorkerFailure
from sgl_moe.router.front import http_head, worker_client
from sgl_moe.router.front.worker_client import READ_PAUSE_BYTES, WorkerClient


@pytest.fixture(autouse=True, params=["response_head", "httptools"])
def head_reader(request, monkeypatch):
    """Every test twice: answers' heads read by ``http_head.response_head`` where they have the common shape, and
    every head by ``httptools`` (as where no C compiler was found)."""
    if request.param == "httptools":
        monkeypatch.setattr(worker_client, "response_head", None)
    elif not http_head.NATIVE:
        pytest.skip("built without a C compiler")
    return request.param


def _client(**kw) -> WorkerClient:
    return WorkerClient(total_timeout_s=kw.pop("total_timeout_s", 10.0), connect_timeout_s=kw.pop("connect", 5.0),
                        keepalive_s=kw.pop("keepalive_s", 30.0), **kw)


READS = ("post", "fetch")
"""The two ways to read a whole answer: ``post`` then ``read``, and ``fetch`` (what forwarding uses)."""


async def _exchange(client: WorkerClient, how: str, url: str, body: bytes = b"{}",
                    headers: dict | None = None) -> tuple[int, dict, bytes]:
    if how == "fetch":
        return await client.fetch(url, body, headers or {})
    async with client.post(url, body, headers or {}) as resp:
        return resp.status, resp.headers, await resp.read()


class _Worker:
    """An aiohttp server; counts the connections it accepted and keeps what each request carried."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict, bytes]] = []
        self.peers: set = set()
        self.release = asyncio.Event()

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/stream", self.stream)
        app.router.add_post("/big", self.big)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def generate(self, request: web.Request) -> web.Response:
        self.peers.add(request.transport.get_extra_info("peername"))
        self.seen.append((request.path_qs, dict(request.headers), await request.read()))
        return web.json_response({"echo": len(self.seen[-1][2])}, status=201, headers={"X-Extra": "yes"})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b"data: 1\n\n")
        await self.release.wait()
        await out.write(b"data: 2\n\n")
        await out.write_eof()
        return out

    async def big(self, request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse()
        await out.prepare(request)
        for i in range(48):
            await out.write(bytes([i]) * 65536)
        await out.write_eof()
        return out


@pytest.mark.parametrize("how", READS)
def test_answers_and_reuses_one_connection(how):
    async def main():
        worker = _Worker()
        url = await worker.start()
        client = _client(headers={"Authorization": "Bearer k"})
        try:
            for i in range(3):
                status, headers, body = await _exchange(client, how, url + "/generate?x=1", b'{"a":%d}' % i,
                                                        {"content-type": "application/json",
                                                         "x-data-parallel-rank": "0"})
                assert status == 201
                assert headers["content-type"].startswith("application/json")
                assert headers["x-extra"] == "yes"
                assert body == b'{"echo": 7}'
        finally:
            client.close()
            await worker.runner.cleanup()
        assert client.connections_made == 1 and len(worker.peers) == 1
        path, headers, body = worker.seen[2]
        assert (path, body) == ("/generate?x=1", b'{"a":2}')
        assert headers["Authorization"] == "Bearer k" and headers["x-data-parallel-rank"] == "0"
        assert headers["Host"] == url.removeprefix("http://")

    asyncio.run(main())


def test_streams_chunks_as_they_come_and_large_bodies_whole():
    async def main():
        worker = _Worker()
        url = await worker.start()
        client = _client()
        try:
            async with client.post(url + "/stream", b"{}", {}) as resp:
                assert resp.headers["content-type"] == "text/event-stream"
                got = []
                async for chunk in resp.chunks():
                    got.append(chunk)
                    worker.release.set()  # the second chunk is sent only once the first arrived
                assert b"".join(got) == b"data: 1\n\ndata: 2\n\n" and got[0] == b"data: 1\n\n"
            async with client.post(url + "/big", b"{}", {}) as resp:  # past READ_PAUSE_BYTES: reading pauses
                body = b""
                async for chunk in resp.chunks():
                    body += chunk
                    await asyncio.sleep(0)
            assert len(body) == 48 * 65536 > READ_PAUSE_BYTES
            assert body == b"".join(bytes([i]) * 65536 for i in range(48))
        finally:
            client.close()
            await worker.runner.cleanup()
        assert client.connections_made == 1

    asyncio.run(main())


def test_fetch_reads_a_large_body_whole_and_keeps_the_connection():
    async def main():
        worker = _Worker()
        url = await worker.start()
        client = _client()
        try:
            for _ in range(2):  # past READ_PAUSE_BYTES: reading pauses, then resumes as fetch takes the chunks
                status, _, body = await client.fetch(url + "/big", b"{}", {})
                assert status == 200 and len(body) == 48 * 65536 > READ_PAUSE_BYTES
                assert body == b"".join(bytes([i]) * 65536 for i in range(48))
        finally:
            client.close()
            await worker.runner.cleanup()
        assert client.connections_made == 1

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("how", READS)
def test_refused_connection_is_a_connect_failure(how):
    async def main():
        client = _client()
        with pytest.raises(WorkerFailure) as info:
            await _exchange(client, how, f"http://127.0.0.1:{_free_port()}/generate")
        assert info.value.connect and info.value.transport and not info.value.timeout

    asyncio.run(main())


async def _raw_server(handle) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


@pytest.mark.parametrize("how", READS)
def test_broken_answers_are_transport_failures(how):
    async def cut_body(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()
        writer.close()

    async def garbage(reader, writer):
        await _read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    async def main():
        for handler in (cut_body, garbage):
            server, url = await _raw_server(handler)
            client = _client()
            try:
                with pytest.raises(WorkerFailure) as info:
                    await _exchange(client, how, url + "/generate")
                assert info.value.transport and not info.value.connect and not info.value.timeout, handler
            finally:
                client.close()
                server.close()

    asyncio.run(main())


@pytest.mark.parametrize("how", READS)
def test_bytes_past_the_answers_length_are_not_read_as_the_next_answer(how):
    """A worker that sends more than its ``Content-Length``, with its answer or after it while the connection is
    idle: the connection is not used again, so the next request opens a new one instead of reading the stray bytes
    as its answer. An answer with stray bytes in the same read fails as a transport failure where its head was read
    in one call (``response_head``); ``httptools`` hands it over whole."""
    stray = b"HTTP/1.1 200 OK\r\n"
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    def worker(later: bool):
        answered = []  # over all connections: only the first answer has stray bytes

        async def handler(reader, writer):
            while True:
                try:
                    await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                first = not answered
                answered.append(1)
                writer.write(ok if later or not first else ok + stray)
                await writer.drain()
                if later and first:
                    await asyncio.sleep(0.05)
                    writer.write(stray)
        return handler

    async def main():
        for later in (False, True):
            server, url = await _raw_server(worker(later))
            client = _client()
            try:
                if later or worker_client.response_head is None:
                    assert await _exchange(client, how, url + "/generate") == (200, {"content-length": "2"}, b"{}")
                else:
                    with pytest.raises(WorkerFailure) as info:
                        await _exchange(client, how, url + "/generate")
                    assert info.value.transport and not info.value.connect and not info.value.timeout
                await asyncio.sleep(0.2)
                assert await _exchange(client, how, url + "/generate") == (200, {"content-length": "2"}, b"{}")
                assert client.connections_made == 2, later
            finally:
                client.close()
                server.close()

    asyncio.run(main())


@pytest.mark.parametrize("how", READS)
def test_no_answer_in_time_is_a_timeout_and_closes_the_connection(how):
    async def silent(reader, writer):
        await _read_request(reader)
        await reader.read()  # until the client closes

    async def slow_body(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n01")
        await reader.read()

    async def main():
        for handler in (silent, slow_body):
            server, url = await _raw_server(handler)
            client = _client(total_timeout_s=0.3)
            t0 = time.monotonic()
            try:
                with pytest.raises(WorkerFailure) as info:
                    await _exchange(client, how, url + "/generate")
                assert info.value.timeout and not info.value.transport, handler
                assert 0.25 < time.monotonic() - t0 < 5
                assert not client._idle.get(next(iter(client._origins.values()))[0])  # not kept for reuse
            finally:
                client.close()
                server.close()

    asyncio.run(main())


@pytest.mark.parametrize("how", READS)
def test_a_connection_the_worker_closed_while_idle_is_replaced_unnoticed(how):
    connections = []

    async def answer_once(reader, writer):  # keep-alive by default, but closes right after answering
        connections.append(writer)
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    async def main():
        server, url = await _raw_server(answer_once)
        client = _client()
        try:
            for _ in range(3):
                assert (await _exchange(client, how, url + "/generate"))[2] == b"ok"
                await asyncio.sleep(0.2)  # the worker has closed the idle connection by now
        finally:
            client.close()
            server.close()
        assert len(connections) == 3 and client.connections_made == 3

    asyncio.run(main())


@pytest.mark.parametrize("how", READS)
def test_a_worker_that_dies_of_a_request_on_a_reused_connection_is_a_transport_failure(how):
    state = {"n": 0}

    async def die_on_second(reader, writer):
        while True:
            await _read_request(reader)
            state["n"] += 1
            if state["n"] == 2:  # the process dies of it: the connection closes, nothing listens any more
                server.close()
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async def main():
        nonlocal server
        server, url = await _raw_server(die_on_second)
        client = _client()
        try:
            assert (await _exchange(client, how, url + "/generate"))[2] == b"ok"
            with pytest.raises(WorkerFailure) as info:
                await _exchange(client, how, url + "/generate")
            assert info.value.transport and not info.value.connect, info.value  # not "nothing reached it"
        finally:
            client.close()
            server.close()

    server = None
    asyncio.run(main())


@pytest.mark.parametrize("how", READS)
def test_server_connection_close_and_old_idle_connections_are_not_reused(how):
    async def close_each(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async def main():
        server, url = await _raw_server(close_each)
        client = _client()
        try:
            for _ in range(2):
                assert (await _exchange(client, how, url + "/generate"))[2] == b"ok"
        finally:
            client.close()
            server.close()
        assert client.connections_made == 2
        worker = _Worker()
        url = await worker.start()
        client = _client(keepalive_s=0.1)
        try:
            for _ in range(2):
                await _exchange(client, how, url + "/generate")
                await asyncio.sleep(0.2)  # older than keepalive_s: closed, not reused
        finally:
            client.close()
            await worker.runner.cleanup()
        assert client.connections_made == 2

    asyncio.run(main())


@pytest.mark.parametrize("how", READS)
def test_a_cancelled_request_closes_its_connection(how):
    gone = []

    async def hold(reader, writer):
        await _read_request(reader)
        await reader.read()  # returns when the client closes the connection
        gone.append(time.monotonic())

    async def main():
        server, url = await _raw_server(hold)
        client = _client()

        async def call():
            await _exchange(client, how, url + "/generate")

        try:
            task = asyncio.create_task(call())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(50):
                if gone:
                    break
                await asyncio.sleep(0.05)
            assert gone, "the worker never saw the connection close"
            assert not client._idle.get(next(iter(client._origins.values()))[0])
        finally:
            client.close()
            server.close()

    asyncio.run(main())


def test_a_header_with_a_line_break_is_refused():
    async def main():
        client = _client()
        with pytest.raises(ValueError, match="line break"):
            async with client.post("http://127.0.0.1:1/generate", b"{}", {"x-a": "1\r\nx-b: 2"}):
                pass

    asyncio.run(main())
