"""The router's HTTP server: its hot routes on bare asyncio protocols, every other request on aiohttp's server.

Every connection starts on a ``BareConnection``, which parses requests with ``httptools`` (llhttp) and answers the
common case itself: a ``POST`` to one of ``HotRoutes.paths`` with a ``Content-Length`` body of at most
``HotRoutes.max_body`` bytes, one request at a time, no query, no ``Expect``, its key accepted. Anything else (another
route or method, a chunked, large or pipelined body, a bad head, a missing key, a request whose answer is streamed)
hands the connection to aiohttp's server for good: the bytes of the request as they arrived are fed to aiohttp's
protocol on the same transport, so its answer is the one the router always gave (its errors, limits and timeouts).

Why: on the 2-core VM aiohttp's server took ~0.1 ms of the router's CPU per request more than bare protocols
(``benchmarks/proxy_floor.py``), a fifth of a short shared-prefix request's whole cost. ``--http-server aiohttp``
serves everything on aiohttp as before.

The bare side keeps aiohttp's timing rules: a connection with no complete request head ``header_timeout_s``
after it opened or after its previous answer is closed; a body still incomplete ``body_timeout_s`` after its head
is answered 408; a client that goes away cancels its request's handler (which aborts it on the worker).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

import httptools
from aiohttp import web

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.errors import error_response
from sgl_moe.router.front.answer import Answer
from sgl_moe.router.front.attempt import PROXIED
from sgl_moe.router.front.auth import allowed, bearer
from sgl_moe.router.front.deadline import Deadline
from sgl_moe.router.front.http_head import request_head
from sgl_moe.router.front.intake import too_slow

log = logging.getLogger("sgl_moe.router")


class Handoff(Exception):
    """Raised by a hot handler that cannot answer a ``BareRequest`` (its answer would be streamed): the request
    goes to aiohttp's server, byte for byte as it arrived, before anything was answered."""


class BareRequest:
    """The part of ``aiohttp.web.Request`` the hot handlers read, for a request whose whole body has arrived."""

    __slots__ = ("path", "headers", "body")
    method = "POST"

    def __init__(self, path: str, headers: dict[str, str], body: bytes) -> None:
        self.path = path
        self.headers = headers
        """Header names in lower case; a repeated header keeps its first value (as ``CIMultiDict.get``)."""
        self.body = body

    @property
    def path_qs(self) -> str:
        return self.path  # a request with a query is aiohttp's

    @property
    def content_length(self) -> int:
        return len(self.body)

    @property
    def content(self) -> BareRequest:
        return self

    def is_eof(self) -> bool:
        return True

    async def read(self) -> bytes:
        return self.body


@dataclass
class BareCounts:
    """What the bare side did (``/metrics``)."""

    answered: int = 0
    """Requests answered on bare protocols."""
    handed_off: Counter[str] = field(default_factory=Counter)
    """Connections handed to aiohttp's server, by why: ``route`` (another route or method, or a query), ``body``
    (no ``Content-Length``, chunked, ``Expect``, or over ``max_body``), ``key`` (the route's key missing or
    wrong: aiohttp answers 401), ``bad_head`` (unparsable, or too long), ``pipelined`` (a request sent before
    the previous one's answer), ``stream`` (an answer to stream)."""


@dataclass(frozen=True)
class HotRoutes:
    """What the bare side serves and how."""

    paths: frozenset[str]
    handle: Callable[[BareRequest], Awaitable[web.StreamResponse]]
    """Answers a request (may raise ``Handoff``); an exception it lets escape is a 500, as aiohttp's
    ``json_errors`` middleware makes it."""
    allowed: Callable[[str | None], bool]
    """Whether the ``Authorization`` header's value opens these routes; False: aiohttp's side answers 401."""
    max_body: int
    header_timeout_s: float
    body_timeout_s: float
    body_timeout_answer: Callable[[], web.Response]
    """The 408 a body too slow gets (the connection closes after it)."""
    counts: BareCounts = field(default_factory=BareCounts)


MAX_HEAD_BYTES = 64 * 1024
"""A request head still incomplete past this many bytes goes to aiohttp, whose limits answer it (8,190 bytes a
line or a header)."""

BARE_MAX_BODY = 1 << 20
"""Largest body the bare side reads; a larger one goes to aiohttp's server."""


def router_routes(cfg: RouterConfig, handle: Callable[[BareRequest], Awaitable[web.StreamResponse]]) -> HotRoutes:
    """The proxied routes under ``cfg``'s key and limits, answered by ``handle`` (``--http-server bare``)."""
    return HotRoutes(paths=frozenset(PROXIED), handle=handle,
                     allowed=lambda header: allowed("client", bearer(header), cfg),
                     max_body=min(cfg.max_body_bytes, BARE_MAX_BODY), header_timeout_s=cfg.header_timeout_s,
                     body_timeout_s=cfg.body_timeout_s, body_timeout_answer=lambda: too_slow(cfg))


_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}
_SKIPPED = frozenset({"content-length", "transfer-encoding", "connection", "date"})


class _Date:
    """The ``Date`` header's line, made once a second."""

    second = -1
    line = b""

    @classmethod
    def now(cls) -> bytes:
        t = int(time.time())
        if t != cls.second:
            cls.second, cls.line = t, f"Date: {formatdate(t, usegmt=True)}\r\n".encode()
        return cls.line


def encode_response(resp: web.StreamResponse | Answer, close: bool) -> bytes:
    """``resp`` (an ``Answer``, or a ``web.Response`` with its body set) as HTTP/1.1 bytes."""
    if type(resp) is Answer:
        status, body = resp.status, resp.body
        return b"".join((_STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status,
                         "".join([f"{name}: {value}\r\n" for name, value in resp.headers.items()]).encode("latin-1"),
                         _Date.now(), b"Content-Length: %d\r\n" % len(body),
                         b"Connection: close\r\n\r\n" if close else b"\r\n", body))
    body = resp.body or b""
    if not isinstance(body, bytes):
        raise TypeError(f"a bare answer needs a bytes body, got {type(body).__name__}")
    lines = [_STATUS_LINES.get(resp.status) or f"HTTP/1.1 {resp.status} {resp.reason}\r\n".encode()]
    for name, value in resp.headers.items():
        if name.lower() not in _SKIPPED:
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    lines.append(_Date.now())
    lines.append(b"Content-Length: %d\r\n" % len(body))
    if close:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)


class BareConnection(asyncio.Protocol):
    """One client connection, served here until a request needs aiohttp (``_hand_off``)."""

    def __init__(self, hot: HotRoutes, aiohttp_protocol: Callable[[], asyncio.Protocol],
                 connections: set[BareConnection]) -> None:
        self.hot = hot
        self.aiohttp_protocol = aiohttp_protocol
        self.connections = connections
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.buf = bytearray()
        """The bytes since the current request began: what aiohttp is fed if the connection is handed over."""
        self.deadline = Deadline(self.loop)
        """The head or body timeout under way (``_arm``)."""
        self.task: asyncio.Task | None = None
        self.paused = False
        """Reading is paused: a pipelined client sent more than a request's worth while one was answered."""
        self.stopping = False
        """The server stops: close after the answer under way."""
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.head_done = self.complete = False
        self.keep_alive = True
        self.refuse: str | None = None
        """Why the request in progress is not for the bare side (a ``BareCounts.handed_off`` reason)."""
        self.second = False
        """Another request began after the current one was complete (pipelining)."""
        self.fast = request_head is not None
        """The current request is read by ``request_head`` (its head is of the common shape, or not all here yet);
        False: by ``httptools``."""
        self.expect = -1
        """``request_head``: the bytes of the head and body together, once the head was read."""
        self.head_len = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)
        self._arm(self.hot.header_timeout_s, self._head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.deadline.close()
        if self.task is not None:
            self.task.cancel()  # as aiohttp's handler_cancellation: the handler aborts the request on its worker
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is not None:  # the next request arrived before this answer: aiohttp serves what follows
            if len(self.buf) > self.hot.max_body + MAX_HEAD_BYTES and not self.paused:
                self.paused = True  # bounded as aiohttp bounds what it buffers; resumed when handed over
                self.transport.pause_reading()
            return
        if self.fast:
            self._read_fast()
            return
        self._feed(data)

    def _read_fast(self) -> None:
        """``data_received`` for a head of the common shape (``http_head``): the head in one call, then the body by
        its length. Any other head goes to ``httptools`` from its first byte."""
        buf = self.buf
        if self.expect < 0:
            head = request_head(buf)
            if head is None:
                if len(buf) > MAX_HEAD_BYTES:
                    self._hand_off(bytes(buf), "bad_head")
                return
            if head is False or head[0] != b"POST" or head[1] not in self.hot.paths:  # the reasons httptools' gave
                self.fast = False
                self._feed(bytes(buf))
                return
            method, self.path, self.headers, self.head_len, self.keep_alive = head
            self.head_done = True
            self._disarm()
            self.refuse = self._judge(method, self.path, self.headers)
            if self.refuse:
                self._hand_off(bytes(buf), self.refuse)
                return
            self.expect = self.head_len + int(self.headers["content-length"])
        if len(buf) < self.expect:
            if self.deadline.at is None:
                self._arm(self.hot.body_timeout_s, self._body_timeout)
            return
        if len(buf) > self.expect:  # the next request began before this one was answered
            self._hand_off(bytes(buf), "pipelined")
            return
        self.complete = True
        self._disarm()
        request = BareRequest(self.path, self.headers, bytes(buf[self.head_len:]))
        self.task = self.loop.create_task(self._answer(request, self.keep_alive, len(buf)))

    def _feed(self, data: bytes) -> None:
        """``data_received`` through ``httptools``."""
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.refuse = "bad_head"  # aiohttp parses the same bytes and answers as it always did
        if not self.head_done and len(self.buf) > MAX_HEAD_BYTES:
            self.refuse = "bad_head"
        if self.second or self.refuse:
            self._hand_off(bytes(self.buf), "pipelined" if self.second else self.refuse)
        elif self.complete:
            self._dispatch()
        elif self.head_done and self.deadline.at is None:
            self._arm(self.hot.body_timeout_s, self._body_timeout)

    # -- httptools callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:
            self.second = True

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        if self.second:  # the next request's head: aiohttp's to judge
            return
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp's flags are reset once the message completes
        self._disarm()
        self.refuse = self._judge(self.parser.get_method(), self.url.decode("latin-1"), self.headers)

    def _judge(self, method: bytes, path: str, h: dict[str, str]) -> str | None:
        """Why a request with this head is not the bare side's (a ``BareCounts.handed_off`` reason), or None."""
        hot = self.hot
        length = h.get("content-length")
        if method != b"POST" or path not in hot.paths:
            return "route"
        if (length is None or not length.isdigit() or int(length) > hot.max_body or "expect" in h
                or "transfer-encoding" in h):
            return "body"
        if not hot.allowed(h.get("authorization")):
            return "key"
        return None

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # -- answering ---------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        self._disarm()
        body = b"".join(self.body)
        head_end = self.buf.find(b"\r\n\r\n") + 4
        if head_end < 4 or head_end + len(body) != len(self.buf):  # bytes this side did not account for
            self._hand_off(bytes(self.buf), "bad_head")
            return
        request = BareRequest(self.url.decode("latin-1"), self.headers, body)
        self.task = self.loop.create_task(self._answer(request, self.keep_alive, len(self.buf)))

    async def _answer(self, request: BareRequest, keep_alive: bool, length: int) -> None:
        try:
            resp = await self.hot.handle(request)
        except Handoff:
            self.task = None
            if self.transport is not None:
                self._hand_off(bytes(self.buf), "stream")
            return
        except Exception as exc:  # a router bug: aiohttp's json_errors middleware answers the same way
            log.exception("POST %s failed inside the router", request.path)
            resp = error_response(500, f"internal router error: {type(exc).__name__}: {exc}", kind="internal_error")
        self.task = None
        transport = self.transport
        if transport is None:
            return
        self.hot.counts.answered += 1
        close = not keep_alive or resp.keep_alive is False or self.stopping
        transport.write(encode_response(resp, close))
        if close:
            transport.close()
            return
        rest = bytes(self.buf[length:])
        self.buf.clear()
        self._reset()
        if rest:  # sent while this request was answered (pipelined): aiohttp serves it and what follows
            self._hand_off(rest, "pipelined")
        else:
            self._arm(self.hot.header_timeout_s, self._head_timeout)

    def _hand_off(self, data: bytes, why: str) -> None:
        """Give this connection to aiohttp's server from ``data`` (the bytes of its current request) on."""
        self.hot.counts.handed_off[why] += 1
        self.deadline.close()
        self.connections.discard(self)
        transport, self.transport = self.transport, None
        if transport is None or transport.is_closing():
            return
        protocol = self.aiohttp_protocol()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)
        if self.paused:
            transport.resume_reading()

    # -- timers --------------------------------------------------------------------------------------
    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self.deadline.set_in(delay, callback)

    def _disarm(self) -> None:
        self.deadline.clear()

    def _head_timeout(self) -> None:
        """No complete request head in time (aiohttp's keep-alive timer): close, as aiohttp does."""
        if self.transport is not None and not self.head_done:
            self.transport.close()

    def _body_timeout(self) -> None:
        if self.transport is not None and not self.complete:
            self.transport.write(encode_response(self.hot.body_timeout_answer(), close=True))
            self.transport.close()

    def close(self) -> None:
        """The server stops: close at once when idle; a request being answered closes after its answer."""
        self.stopping = True
        if self.task is None and self.transport is not None:
            self.transport.close()


class BareSite(web.TCPSite):
    """aiohttp's TCP site, its connections starting on ``BareConnection``."""

    def __init__(self, runner: web.AppRunner, hot: HotRoutes, host: str, port: int, reuse_port: bool) -> None:
        super().__init__(runner, host, port, reuse_port=reuse_port)
        self.hot = hot
        self.connections: set[BareConnection] = set()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers with the runner; TCPSite.start would serve aiohttp's protocol
        aiohttp_protocol = self._runner.server
        hot, connections = self.hot, self.connections
        self._server = await asyncio.get_running_loop().create_server(
            lambda: BareConnection(hot, aiohttp_protocol, connections), self._host, self._port,
            backlog=self._backlog, reuse_port=self._reuse_port)

    async def stop(self) -> None:
        await super().stop()
        for conn in list(self.connections):
            conn.close()


async def _serve(app: web.Application, hot: HotRoutes, host: str, port: int, reuse_port: bool) -> None:
    runner = web.AppRunner(app, handle_signals=True, access_log=None, keepalive_timeout=hot.header_timeout_s,
                           handler_cancellation=True)
    await runner.setup()
    try:
        await BareSite(runner, hot, host, port, reuse_port).start()
        while True:
            await asyncio.sleep(3600)
    finally:
        await runner.cleanup()


def serve(app: web.Application, hot: HotRoutes, *, host: str, port: int, loop: asyncio.AbstractEventLoop,
          reuse_port: bool = False) -> None:
    """Run ``app`` on ``host:port`` until SIGINT or SIGTERM, ``hot``'s requests on bare protocols (what
    ``web.run_app`` does, with this server's site). Raises what binding the port raises."""
    asyncio.set_event_loop(loop)
    main = loop.create_task(_serve(app, hot, host, port, reuse_port))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            for tasks in ([main], list(asyncio.all_tasks(loop))):  # the app's cleanup first, then what is left
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
