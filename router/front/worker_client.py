"""The router's HTTP/1.1 client for the requests it forwards to workers.

Connections to each worker are kept alive and reused; each carries one request at a time. Requests are written
as bytes, responses parsed by ``httptools`` (llhttp, the parser uvicorn serves SGLang with) on asyncio protocols.
On the 2-core VM a proxy built this way spent 0.07-0.08 ms of CPU per request where one on aiohttp's client and
server spent 0.36-0.44 ms, and aiohttp's client alone about 0.2 ms (``benchmarks/router_capacity.py`` measures
the router). Everything else the router asks of a worker (health, aborts, discovery, tokenizer files) still goes
through aiohttp.

Failures are ``WorkerFailure``: a connection that cannot be made is ``connect`` (nothing reached the worker), a
connection that breaks afterwards is ``transport``, no connection or no complete answer within its timeout is
``timeout``. A kept-alive connection the worker closed while idle is noticed before
any byte of an answer; the request is then sent once more on a new connection. If none can be made, the worker
may have died of the request itself: that is a ``transport`` failure, not ``connect``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from sgl_moe.router.errors import WorkerFailure
from sgl_moe.router.front.deadline import Deadline
from sgl_moe.router.front.http_head import response_head

MAX_HEAD_BYTES = 64 * 1024
"""An answer's head not complete past this many bytes is left to ``httptools`` (and its limits)."""
READ_PAUSE_BYTES = 1 << 20
"""Bytes of a streamed answer buffered before reading from the worker pauses until the client takes them."""


@dataclass(frozen=True)
class Origin:
    """Where a worker listens: scheme, host and port, and the ``Host`` header for it."""

    https: bool
    host: str
    port: int
    host_header: bytes

    @classmethod
    def of(cls, scheme: str, host: str, port: int | None) -> Origin:
        https = scheme == "https"
        port = port or (443 if https else 80)
        shown = f"[{host}]" if ":" in host else host
        return cls(https, host, port, f"{shown}:{port}".encode("idna"))


class WorkerResponse:
    """A worker's answer: status and headers at once, the body by ``read`` or ``chunks`` (once)."""

    def __init__(self, exchange: _Exchange) -> None:
        self._ex = exchange
        self.status = exchange.status
        self.headers = exchange.headers
        """Header names in lower case."""

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        async for chunk in self.chunks():
            parts.append(chunk)
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives. Raises ``WorkerFailure`` when the connection breaks or the time runs out."""
        ex = self._ex
        while True:
            if ex.buffer:
                chunk = ex.buffer.popleft()
                ex.buffered -= len(chunk)
                if ex.paused and ex.buffered < READ_PAUSE_BYTES // 2:
                    ex.resume()
                yield chunk
                continue
            if ex.complete:
                return
            if ex.error is not None:
                raise ex.error
            ex.waiter = asyncio.get_running_loop().create_future()
            await ex.waiter


class _Exchange:
    """One request on one connection, as the protocol fills it in."""

    __slots__ = ("conn", "status", "headers", "head", "buffer", "buffered", "complete", "error", "waiter",
                 "answered", "paused")

    def __init__(self, conn: _Connection, head: asyncio.Future) -> None:
        self.conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head = head
        """Done when the status line and headers are in (or the exchange failed)."""
        self.buffer: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.error: WorkerFailure | None = None
        self.waiter: asyncio.Future | None = None
        self.answered = False
        """Any byte of the answer arrived."""
        self.paused = False

    def wake(self) -> None:
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    def fail(self, error: WorkerFailure) -> None:
        if self.complete or self.error is not None:
            return
        self.error = error
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved here: a failed exchange nobody awaits any more is not an error
        self.wake()

    def resume(self) -> None:
        self.paused = False
        if self.conn.transport is not None and not self.conn.transport.is_closing():
            self.conn.transport.resume_reading()


class _Stale(Exception):
    """A reused connection closed before any byte of the answer: the worker closed it while it was idle."""


class _Connection(asyncio.Protocol):
    """One kept-alive connection to a worker. An answer whose head has the common shape (``http_head``: a
    ``Content-Length``, no ``Transfer-Encoding``) is read by ``response_head`` and its length; any other by
    ``httptools``, which calls the ``on_*`` methods while parsing."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.deadline = Deadline(asyncio.get_running_loop())
        """The total timeout of the exchange under way (``WorkerClient._send``)."""
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: _Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self.uses = 0
        self.fast = False
        """The current answer is read by ``response_head``."""
        self.head = bytearray()
        """``response_head``: the answer's bytes until its head is complete."""
        self.remaining = -1
        """``response_head``: the body's bytes still to come (-1: the head is not read yet)."""
        self.keep_alive = True

    # asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # bytes with no request out: the connection is unusable
            self.close()
            return
        ex.answered = True
        if self.fast:
            self._read_fast(ex, data)
            return
        self._feed(ex, data)

    def _feed(self, ex: _Exchange, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            ex.fail(WorkerFailure(f"unreadable HTTP answer: {exc}", transport=True))
            self.close()

    def _read_fast(self, ex: _Exchange, data: bytes) -> None:
        """``data_received`` for an answer of the common shape: its head in one call, then its body by length."""
        if self.remaining < 0:
            buf = self.head
            buf += data
            head = response_head(buf)
            if head is None and len(buf) <= MAX_HEAD_BYTES:
                return
            if not head:  # another shape (or a head too long): httptools reads it from its first byte
                self.fast = False
                data = bytes(buf)
                buf.clear()
                self._feed(ex, data)
                return
            ex.status, ex.headers, head_len, self.keep_alive = head
            self.remaining = int(ex.headers["content-length"])
            data = bytes(buf[head_len:])
            buf.clear()
            if not ex.head.done():
                ex.head.set_result(None)
        if data:
            extra = len(data) - self.remaining
            if extra > 0:  # bytes past the body: no request asked for them
                data = data[:self.remaining]
            self.remaining -= len(data)
            if data:
                self.on_body(data)
            if extra > 0:
                ex.fail(WorkerFailure(f"unreadable HTTP answer: {extra} bytes after its body", transport=True))
                self.close()
                return
        if self.remaining == 0:
            ex.complete = True
            if not self.keep_alive:
                self.close()
            ex.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.deadline.close()
        ex = self.exchange
        if ex is None or ex.complete:
            return
        if self.uses > 1 and not ex.answered:
            ex.fail(_Stale())  # type: ignore[arg-type]
            return
        why = f"{type(exc).__name__}: {exc}" if exc else "the worker closed the connection"
        ex.fail(WorkerFailure(f"connection to the worker broke: {why}", transport=True))

    # httptools
    def on_message_begin(self) -> None:
        if self.exchange.complete:  # a second answer to one request (bytes past the first): no request asked for
            self.close()            # it, and the next one sent here would read it as its own

    def on_header(self, name: bytes, value: bytes) -> None:
        self.exchange.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        ex = self.exchange
        ex.status = self.parser.get_status_code()
        if not ex.head.done():
            ex.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        ex.buffer.append(body)
        ex.buffered += len(body)
        if ex.buffered > READ_PAUSE_BYTES and not ex.paused:
            ex.paused = True
            self.transport.pause_reading()
        ex.wake()

    def on_message_complete(self) -> None:
        ex = self.exchange
        ex.complete = True
        if not self.parser.should_keep_alive():
            self.close()
        ex.wake()

    # the client
    def send(self, data: bytes, head: asyncio.Future) -> _Exchange:
        self.uses += 1
        self.exchange = _Exchange(self, head)
        self.fast, self.remaining = response_head is not None, -1
        self.head.clear()
        self.transport.write(data)
        return self.exchange

    def reusable(self) -> bool:
        ex = self.exchange
        return not self.closed and ex is not None and ex.complete and not ex.buffer and not ex.paused

    def close(self) -> None:
        self.closed = True
        self.deadline.close()
        if self.transport is not None:
            self.transport.close()


class WorkerClient:
    """Sends requests to workers on kept-alive connections (see the module)."""

    def __init__(self, *, total_timeout_s: float | None, connect_timeout_s: float, keepalive_s: float,
                 headers: Mapping[str, str] | None = None) -> None:
        self.total_timeout_s = total_timeout_s
        """The whole exchange, body included (``--request-timeout-s``)."""
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        """An idle connection older than this is closed rather than reused (``--worker-keepalive-s``)."""
        self._fixed = b"".join(_header_line(k, v) for k, v in (headers or {}).items())
        """Header lines sent with every request (the router's worker key)."""
        self._idle: dict[Origin, list[_Connection]] = {}
        self._origins: dict[str, tuple[Origin, str, list[_Connection]]] = {}
        """URL -> its origin, its request target and the origin's idle connections (``_idle``'s list: looked up
        once per URL, not hashed per request)."""
        self._ssl: ssl.SSLContext | None = None
        self.connections_made = 0
        self.closed = False

    @asynccontextmanager
    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AsyncIterator[WorkerResponse]:
        """``POST url`` with ``body``; the answer, open until the block ends (a body not read to its end then
        closes the connection). Raises ``WorkerFailure``."""
        idle, conn, ex = await self._open(url, body, headers)
        try:
            yield WorkerResponse(ex)
        finally:
            self._end(idle, conn)

    async def fetch(self, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
        """``POST url`` with ``body``; the answer's status, headers (names in lower case) and whole body. What
        ``post`` then ``read`` give, in one await when the answer comes at once (the forwarded non-streamed
        requests). Raises ``WorkerFailure``."""
        idle, conn, ex = await self._open(url, body, headers)
        try:
            parts = []
            while True:
                buffer = ex.buffer
                while buffer:
                    parts.append(buffer.popleft())
                ex.buffered = 0
                if ex.complete:
                    return ex.status, ex.headers, b"".join(parts)
                if ex.error is not None:
                    raise ex.error
                if ex.paused:
                    ex.resume()
                ex.waiter = asyncio.get_running_loop().create_future()
                await ex.waiter
        finally:
            self._end(idle, conn)

    async def _open(self, url: str, body: bytes, headers: Mapping[str, str]
                    ) -> tuple[list[_Connection], _Connection, _Exchange]:
        """Send ``POST url`` and wait for the answer's head, under the total timeout (counted from now, kept by the
        connection's ``deadline`` once it has one); ``_end`` closes the exchange."""
        origin, target, idle = self._split(url)
        data = b"".join((b"POST ", target.encode(), b" HTTP/1.1\r\nHost: ", origin.host_header, b"\r\n", self._fixed,
                         b"".join([_header_line(k, v) for k, v in headers.items()]),
                         b"Content-Length: %d\r\n\r\n" % len(body), body))
        loop = asyncio.get_running_loop()
        clock = _Clock(self.total_timeout_s, loop.time())
        for again in (False, True):
            conn = self._checkout(idle)
            if conn is None:
                try:
                    conn = await self._connect(loop, origin)
                except WorkerFailure as exc:
                    if again and exc.connect:  # the request may have reached the worker before it went away
                        raise WorkerFailure(f"connection to the worker broke before it answered, and {exc}",
                                            transport=True) from None
                    raise
            if clock.due is not None:
                if loop.time() >= clock.due:
                    conn.close()
                    raise clock.failure()
                conn.deadline.set(clock.due, clock.expire)
            head = loop.create_future()
            ex = clock.exchange = conn.send(data, head)
            try:
                await head
                return idle, conn, ex
            except _Stale:
                conn.close()
                continue
            except BaseException:
                conn.close()
                raise
        raise WorkerFailure("connection to the worker broke: closed twice before answering", transport=True)

    def _end(self, idle: list[_Connection], conn: _Connection) -> None:
        """An exchange ended: drop its timeout, and keep its connection for the next request when its answer was read
        to the end."""
        conn.deadline.clear()
        conn.exchange = None if conn.reusable() else conn.exchange
        if conn.exchange is None and not self.closed:
            conn.idle_since = time.monotonic()
            idle.append(conn)
        else:
            conn.close()

    def _checkout(self, idle: list[_Connection]) -> _Connection | None:
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, origin: Origin) -> _Connection:
        if origin.https and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    _Connection, origin.host, origin.port, ssl=self._ssl if origin.https else None)
        except TimeoutError:
            raise WorkerFailure(f"TimeoutError: no connection to {origin.host}:{origin.port} within "
                                f"{self.connect_timeout_s:g} s", transport=False, timeout=True) from None
        except OSError as exc:  # refused, unreachable, unknown host, TLS handshake
            raise WorkerFailure(f"cannot connect to {origin.host}:{origin.port}: {type(exc).__name__}: {exc}",
                                transport=True, connect=True) from None
        self.connections_made += 1
        return conn

    def _split(self, url: str) -> tuple[Origin, str, list[_Connection]]:
        known = self._origins.get(url)
        if known is None:
            parts = urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            origin = Origin.of(parts.scheme, parts.hostname or "", parts.port)
            known = self._origins[url] = (origin, target, self._idle.setdefault(origin, []))
            if len(self._origins) > 4096:  # URLs are workers x routes; never grows in practice
                self._origins.clear()
        return known

    def close(self) -> None:
        """Close every idle connection; connections in use close when their exchange ends."""
        self.closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
            idle.clear()
        self._idle.clear()
        self._origins.clear()


class _Clock:
    """One request's total timeout: ``expire``, run at ``due`` by its connection's ``deadline``, fails the exchange
    under way."""

    __slots__ = ("seconds", "due", "exchange")

    def __init__(self, seconds: float | None, start: float) -> None:
        self.seconds = seconds
        self.due = start + seconds if seconds else None
        """The loop time the answer must be complete by (None: no total timeout)."""
        self.exchange: _Exchange | None = None

    def failure(self) -> WorkerFailure:
        return WorkerFailure(f"TimeoutError: no complete answer within {self.seconds:g} s", transport=False,
                             timeout=True)

    def expire(self) -> None:
        ex = self.exchange
        if ex is not None and not ex.complete:
            ex.fail(self.failure())
            ex.conn.close()


def _header_line(name: str, value: str) -> bytes:
    if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
        raise ValueError(f"header {name!r} holds a line break")
    return f"{name}: {value}\r\n".encode("latin-1")
