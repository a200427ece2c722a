"""Subscriber to one SGLang KV-event publisher that keeps a router's committed block table exact.

SGLang's ``ZmqEventPublisher`` (one per worker and attention-DP rank) sends each event batch on a PUB
socket as three frames (topic, 8-byte big-endian sequence number, msgpack payload), numbering batches
0, 1, 2, ... and keeping the last ``buffer_steps`` of them for its ROUTER replay socket: a DEALER sends
``[b"", start_seq]`` and gets ``[b"", topic, seq, payload]`` for every buffered batch with
``seq >= start_seq``, then the end marker ``[b"", b"", -1, b""]``.

``EventListener`` hands every batch to an ``EventSink`` exactly once and in sequence order. PUB/SUB loses
messages (slow joiner, high-water mark, reconnects); a missing sequence number is fetched from the replay
buffer. When it cannot be, or the publisher restarted, the sink is told to reset (empty its table for
that worker and rank) and delivery goes on from the earliest batch still known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import zmq
import zmq.asyncio

from sgl_moe.kv_event_keys import ClientKeys
from sgl_moe.router.membership.curve_client import HANDSHAKE_FAILURES, secure, watch_handshakes
from sgl_moe.router.membership.kv_events import EventBatch, KVEventDecodeError, decode_frames

logger = logging.getLogger("sgl_moe.router.events")

_END_SEQ = (-1).to_bytes(8, "big", signed=True)
_DECODE_WARNING_INTERVAL_S = 10.0
_CHUNK = 256
"""Messages read, or batches delivered, between two yields to the event loop."""
_LIVE_READ_S = 0.02
"""During a replay, the longest the live socket waits to be read (``EventListener._request``)."""


@dataclass(frozen=True)
class EventSource:
    """Where one publisher (one worker, one attention-DP rank) sends its KV events."""

    worker_id: str
    dp_rank: int
    endpoint: str
    """PUB endpoint to connect to, e.g. ``tcp://127.0.0.1:31000``."""
    replay_endpoint: str | None
    """The publisher's ROUTER replay endpoint; without one, lost batches cannot be recovered."""
    topic: str = ""
    """Topic the publisher sends on; messages with any other topic are skipped."""


class EventSink(Protocol):
    """Owner of the committed block table the listener keeps up to date."""

    def on_batch(self, source: EventSource, batch: EventBatch) -> None:
        """Apply one batch. Called exactly once per batch, in sequence order."""

    def on_reset(self, source: EventSource, reason: str) -> None:
        """Empty the table for ``source``'s worker and rank: what it held can no longer be trusted."""


@dataclass
class ListenerStats:
    """Counters of one listener, read by the router's /metrics."""

    batches: int = 0
    """Batches delivered to the sink, live or replayed."""
    events: int = 0
    gaps: int = 0
    """Live batches that arrived with earlier sequence numbers missing."""
    replays: int = 0
    """Replays that delivered everything missing (the one at connect time included)."""
    replay_failures: int = 0
    resets: int = 0
    decode_errors: int = 0
    last_seq: int = -1
    """Sequence number of the last batch delivered; -1 right after a reset."""
    last_lag_s: float = 0.0
    """Wall-clock time between the publisher stamping the last delivered batch and its delivery."""
    connected_at: float = 0.0
    handshake_failures: int = 0
    """Connection attempts the publisher and the router could not agree on (CURVE keys, mechanism)."""


@dataclass(init=False)
class _Received:
    """A decoded batch and its payload, whose digest tells a replayed copy of a batch from a restarted
    publisher's different batch under the same sequence number (computed only when compared: most batches
    never are)."""

    batch: EventBatch
    payload: bytes

    def __init__(self, batch: EventBatch, payload: bytes) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.batch = batch
        self.payload = payload

    @property
    def digest(self) -> int:
        return hash(self.payload)


class EventListener:
    """Follows one publisher: owns the SUB socket, the ordering, gap and restart logic, and ``stats``.

    ``drop_seqs`` is fault injection: live batches with these sequence numbers are discarded on receipt
    (replayed ones never are). ``curve``: the router's CURVE keys (``--kv-events-keys``), used on both the SUB
    and the replay socket; a publisher started with ``--moe-kv-events-keys`` talks to nothing else.
    ``run()`` is meant to be called once.
    """

    def __init__(self, source: EventSource, sink: EventSink, *, ctx: zmq.asyncio.Context | None = None,
                 replay_timeout_s: float = 2.0, drop_seqs: frozenset[int] = frozenset(),
                 curve: ClientKeys | None = None) -> None:
        self.source = source
        self.sink = sink
        self._curve = curve
        self.stats = ListenerStats()
        self._ctx = ctx
        self._replay_timeout_s = replay_timeout_s
        self._drop_seqs = drop_seqs
        self._who = f"worker {source.worker_id} rank {source.dp_rank}"
        self._last = -1
        """Sequence number of the last batch delivered since the last reset."""
        self._last_payload: bytes | None = None
        """Payload of that batch."""
        self._replayed: dict[int, int] = {}
        """seq -> digest of batches delivered from a replay that the live stream has not passed yet."""
        self._backlog: deque[_Received] = deque()
        """Live batches received but not handled yet (they pile up while a replay runs)."""
        self._last_decode_warning = -math.inf
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._woken: asyncio.Future[None] | None = None
        """While the socket's reader delivers (``_on_readable``): what wakes the task for the backlog."""
        self._read: Callable[[], list[list[bytes]]] = list
        """What reads the socket's waiting messages (``_reading``), once ``run()`` has a socket."""

    async def run(self) -> None:
        """Deliver batches until ``stop()``. Bad input is counted and logged, never raised; an exception
        from the sink ends the run and propagates."""
        if self._stopped:
            return
        self._task = task = asyncio.current_task()
        assert task is not None
        ctx = self._ctx if self._ctx is not None else zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        monitor = sub.get_monitor_socket(HANDSHAKE_FAILURES)
        watch = asyncio.create_task(watch_handshakes(monitor, self._curve, self.stats, self._who,
                                                     self.source.endpoint))
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt_string(zmq.SUBSCRIBE, self.source.topic)
            secure(sub, self._curve)
            sub.connect(self.source.endpoint)
            self.stats.connected_at = time.time()
            logger.info("%s: subscribed to %s (replay endpoint: %s%s)", self._who, self.source.endpoint,
                        self.source.replay_endpoint, "; CURVE" if self._curve is not None else "")
            self._reset("connected: starting from an empty table")
            if self.source.replay_endpoint is not None:
                await self._resync(sub, trigger=None)
            backlog = self._backlog
            raw = zmq.Socket.shadow(sub.underlying)
            fd = raw.getsockopt(zmq.FD)
            loop = asyncio.get_running_loop()
            self._read = _reading(raw)
            while True:
                # In order, a batch is delivered by the socket's reader itself (``_on_readable``), in the turn it is
                # read: no future, task step or yield per message. This task wakes only for what needs awaiting.
                self._woken = woken = loop.create_future()
                loop.add_reader(fd, self._on_readable)
                self._on_readable()  # what came before the reader was registered
                try:
                    await woken
                finally:
                    self._woken = None
                    # While the task has the backlog the reader would return at once and leave the fd readable: the
                    # loop would call it every turn. A replay reads this socket itself (``_request``).
                    loop.remove_reader(fd)
                # Up to _CHUNK batches a turn: one a turn fell behind a busy router's requests (each finished request
                # is a batch from its worker), and its tables with it (2.3 s behind, half the events unread, at
                # 700 requests/s in benchmarks/router_capacity.py).
                while backlog:
                    for _ in range(min(len(backlog), _CHUNK)):
                        await self._handle(sub, backlog.popleft())
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            if not self._stopped:
                raise
            task.uncancel()
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            if self._ctx is None:
                ctx.destroy(linger=0)
            self._task = None

    def stop(self) -> None:
        """Make ``run()`` return promptly; it closes its sockets on the way out. Callable from any thread."""
        self._stopped = True
        task = self._task
        if task is not None and not task.done():
            task.get_loop().call_soon_threadsafe(task.cancel)

    def _on_readable(self) -> None:
        """The socket's reader: deliver what waits, while each batch follows the last delivered one.

        Anything else (a gap, a sequence number gone back, the live copy of a replayed batch) and every batch after
        it go to the backlog, and the listener's task is woken to handle them in order (``_handle``, which may
        replay). A full read (``_CHUNK`` messages) reads again next turn: the socket's fd may not signal the rest.
        An exception from the sink ends ``run()`` with it."""
        woken = self._woken
        if woken is None or woken.done():
            return  # the task has the backlog; it reads again when it registers the reader anew
        backlog = self._backlog
        try:
            messages = self._read()
            for frames in messages:
                received = self._received(frames)
                if received is None:
                    continue
                if backlog or self._replayed or received.batch.seq != self._last + 1:
                    backlog.append(received)
                else:
                    self._deliver(received, replayed=False)
        except BaseException as exc:
            woken.set_exception(exc)
            return
        if backlog:
            woken.set_result(None)
        elif len(messages) >= _CHUNK:
            woken.get_loop().call_soon(self._on_readable)

    def _take(self, frames: list[bytes]) -> None:
        """Queue one live message; malformed, foreign-topic and fault-injected ones are skipped."""
        received = self._received(frames)
        if received is not None:
            self._backlog.append(received)

    def _received(self, frames: list[bytes]) -> _Received | None:
        """One live message's batch; None for a malformed, foreign-topic or fault-injected one."""
        decoded = self._decode(frames)
        if decoded is None or decoded[0] != self.source.topic:
            return None
        received = decoded[1]
        if received.batch.seq in self._drop_seqs:
            logger.debug("%s: dropping live seq %d (fault injection)", self._who, received.batch.seq)
            return None
        return received

    async def _handle(self, sub: zmq.asyncio.Socket, received: _Received) -> None:
        """Deliver one live batch, after recovering whatever is missing before it."""
        seq = received.batch.seq
        while self._replayed and (oldest := next(iter(self._replayed))) < seq:
            del self._replayed[oldest]  # the live stream is past it: no live copy of it can come any more
        if seq <= self._last:
            if self._replayed.get(seq) == received.digest:
                return  # the live copy of a batch a replay already delivered
            self._reset(f"publisher restarted (seq went from {self._last} to {seq})")
        if seq == self._last + 1:
            self._deliver(received, replayed=False)
            return
        self.stats.gaps += 1
        logger.info("%s: gap: seq %d arrived after %d", self._who, seq, self._last)
        await self._resync(sub, trigger=received)

    async def _resync(self, sub: zmq.asyncio.Socket, trigger: _Received | None) -> None:
        """Deliver the batches after the last delivered one from the replay buffer.

        ``trigger`` is the live batch that revealed a gap (None: rebuilding right after a reset); the replay
        must reach it. If it cannot, the sink is reset (unless its table is already empty) and delivery goes
        on from a replayed run that reaches ``trigger``, else from ``trigger`` itself.
        """
        run, problem = await self._replay_after_last(sub)
        if problem is None and run and run[0].batch.seq != self._last + 1:
            problem = f"the replay buffer starts at seq {run[0].batch.seq}"
        if problem is None and trigger is not None and not _reaches(run, trigger):
            problem = f"the replay does not hold live seq {trigger.batch.seq}"
        if problem is None:
            await self._deliver_run(run, replayed=True)
            self.stats.replays += 1
            span = f" (seq {run[0].batch.seq}..{run[-1].batch.seq})" if run else ""
            logger.info("%s: replayed %d batches%s", self._who, len(run), span)
            return
        self.stats.replay_failures += 1
        lost = f"seq {self._last + 1}..{trigger.batch.seq - 1}" if trigger else "earlier batches"
        reason = f"lost {lost} and could not replay them: {problem}"
        if self._last >= 0:
            self._reset(reason)
        else:
            logger.warning("%s: %s", self._who, reason)
        replayed = trigger is None or _reaches(run, trigger)
        if trigger is not None and not replayed:
            run = [trigger]
        if run:
            self._last = run[0].batch.seq - 1
        await self._deliver_run(run, replayed=replayed)

    async def _replay_after_last(self, sub: zmq.asyncio.Socket) -> tuple[list[_Received], str | None]:
        """Fetch the buffered batches after the last delivered one, and what went wrong, if anything.

        Asks from the last delivered seq itself to check the publisher still has that same batch: if not,
        it restarted, so the sink is reset and the whole buffer fetched.
        """
        endpoint = self.source.replay_endpoint
        if endpoint is None:
            return [], "the publisher has no replay endpoint"
        if self._last < 0:
            return await self._fetch(sub, endpoint, 0)
        run, problem = await self._fetch(sub, endpoint, self._last)
        if run and run[0].batch.seq == self._last:
            if run[0].payload == self._last_payload:
                return run[1:], problem
            self._reset(f"publisher restarted (it replays a different batch as seq {self._last})")
            return await self._fetch(sub, endpoint, 0)
        return run, problem

    async def _fetch(self, sub: zmq.asyncio.Socket, endpoint: str,
                     start: int) -> tuple[list[_Received], str | None]:
        """The contiguous run of buffered batches from ``start`` on, and what went wrong if it is incomplete.

        The publisher's ROUTER silently drops replies once its pipe to us is full, so a long answer can skip
        batches: the rest is then asked for again, for as long as each answer brings something.
        """
        run: list[_Received] = []
        while True:
            had = len(run)
            problem = await self._request(sub, endpoint, run[-1].batch.seq + 1 if run else start, run)
            if problem is None or len(run) == had:
                return run, problem
            logger.info("%s: replay incomplete after seq %d (%s); asking for the rest", self._who,
                        run[-1].batch.seq, problem)

    async def _request(self, sub: zmq.asyncio.Socket, endpoint: str, start: int, run: list[_Received]) -> str | None:
        """One replay request on a fresh DEALER socket; appends the answer's batches to ``run`` while they
        follow on from it. Returns what went wrong, or None once the answer ended. Live batches arriving
        meanwhile are queued.

        Gives up when the endpoint stays silent for ``replay_timeout_s`` (live batches meanwhile do not count); an
        answer that keeps coming is read to its end.

        The live socket is read here directly (every ``_LIVE_READ_S`` at least), not through ``zmq.asyncio``'s poller.
        Registered there, every live batch woke the poll as an answer would, so a dead replay endpoint was never
        found silent while its worker published, and the table stayed as it was (empty, at connect) for as long as the
        worker kept publishing. It also kept pyzmq's own handler off this socket's fd: that handler asks the socket
        for its events, which takes in the signal of a waiting message without reading it, and ``_on_readable``
        relies on no one else doing so.
        """
        dealer = sub.context.socket(zmq.DEALER)
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, 0)  # drop nothing on our side of the pipe
            secure(dealer, self._curve)
            dealer.connect(endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")], flags=zmq.NOBLOCK)
            due = start
            poller = zmq.asyncio.Poller()
            poller.register(dealer, zmq.POLLIN)
            raw_sub, raw_dealer = zmq.Socket.shadow(sub.underlying), zmq.Socket.shadow(dealer.underlying)
            heard = time.monotonic()
            while True:
                ready = dict(await poller.poll(min(_LIVE_READ_S, self._replay_timeout_s) * 1000))
                for frames in _ready_messages(raw_sub):
                    self._take(frames)
                if dealer not in ready:
                    if time.monotonic() - heard >= self._replay_timeout_s:
                        return f"{endpoint} sent nothing for {self._replay_timeout_s}s"
                    continue
                heard = time.monotonic()
                for frames in _ready_messages(raw_dealer):
                    if len(frames) == 4 and frames[0] == b"" and frames[2] == _END_SEQ:
                        return None
                    decoded = self._decode(frames[1:]) if frames[:1] == [b""] else None
                    if decoded is None or decoded[0] != self.source.topic:
                        return "a malformed replay message"
                    seq = decoded[1].batch.seq
                    if seq != due and (run or seq < due):  # the first may be later: the buffer moved on
                        return f"the replay sent seq {seq} where {due} was due"
                    run.append(decoded[1])
                    due = seq + 1
                await asyncio.sleep(0)  # a long answer must not starve the event loop
        except zmq.ZMQError as exc:
            return f"replay from {endpoint} failed: {exc}"
        finally:
            dealer.close(linger=0)

    def _decode(self, frames: list[bytes]) -> tuple[str, _Received] | None:
        """(topic, batch) of one 3-frame message; None (counted, logged) if it is malformed."""
        try:
            topic, batch = decode_frames(frames)
            if batch.seq < 0:
                raise KVEventDecodeError(f"negative sequence number {batch.seq}")
        except KVEventDecodeError as exc:
            self.stats.decode_errors += 1
            now = time.monotonic()
            if now - self._last_decode_warning >= _DECODE_WARNING_INTERVAL_S:
                self._last_decode_warning = now
                logger.warning("%s: skipping a malformed message (%d so far): %s", self._who,
                               self.stats.decode_errors, exc)
            return None
        return topic, _Received(batch, frames[2])

    async def _deliver_run(self, run: list[_Received], *, replayed: bool) -> None:
        for i, received in enumerate(run, 1):
            self._deliver(received, replayed=replayed)
            if i % _CHUNK == 0:
                await asyncio.sleep(0)

    def _deliver(self, received: _Received, *, replayed: bool) -> None:
        batch = received.batch
        self.sink.on_batch(self.source, batch)
        self._last, self._last_payload = batch.seq, received.payload
        if replayed:
            self._replayed[batch.seq] = received.digest
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        self.stats.last_seq = batch.seq
        self.stats.last_lag_s = time.time() - batch.ts

    def _reset(self, reason: str) -> None:
        self.sink.on_reset(self.source, reason)
        self._last, self._last_payload = -1, None
        self._replayed.clear()
        self.stats.resets += 1
        self.stats.last_seq = -1
        logger.info("%s: reset: %s", self._who, reason)


def _reaches(run: list[_Received], live: _Received) -> bool:
    """Whether a contiguous replayed run holds the same batch as ``live``."""
    if not run or not run[0].batch.seq <= live.batch.seq <= run[-1].batch.seq:
        return False
    return run[live.batch.seq - run[0].batch.seq].digest == live.digest


def _reading(raw: zmq.Socket) -> Callable[[], list[list[bytes]]]:
    """What reads ``raw``'s waiting messages (``_ready_messages``'s answer): ``native_zmq_read`` on the libzmq pyzmq
    loaded where it was built and found, else ``_ready_messages`` through pyzmq."""
    if READER is None:
        return lambda: _ready_messages(raw)
    handle, ready = raw.underlying, READER.ready
    return lambda: ready(handle, _CHUNK)


def _ready_messages(raw: zmq.Socket) -> list[list[bytes]]:
    """The messages a socket can hand over without waiting, at most ``_CHUNK`` of them. ``raw``: a plain
    (``Socket.shadow``) socket on the asyncio socket's handle, read without the future ``zmq.asyncio`` makes for each
    receive (6–9 µs a message on the 2-core VM). It asks the socket whether a message is there (``EVENTS``, which also
    has it take in its pending commands, after which its ``zmq.FD`` signals the next change:
    ``EventListener._on_readable``) rather than reading until ``zmq.Again`` (6 µs for the exception pyzmq builds), and
    tells a message's last frame by ``Frame.more`` rather than asking ``RCVMORE``: each ``getsockopt`` costs pyzmq an
    option enum lookup, ~2 µs."""
    messages = []
    recv, get = raw.recv, raw.getsockopt
    while len(messages) < _CHUNK and get(_EVENTS) & _POLLIN:
        try:
            frame = recv(_NOBLOCK, copy=False)
        except zmq.Again:  # not expected after POLLIN; read again next turn
            break
        parts = [frame.bytes]
        while frame.more:
            frame = recv(_NOBLOCK, copy=False)
            parts.append(frame.bytes)
        messages.append(parts)
    return messages


_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


def _libzmq_path() -> str | None:
    """The file of the libzmq mapped into this process (pyzmq's), from ``/proc/self/maps``; None where there is none
    to read (not Linux) or none is mapped."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and "/libzmq" in parts[5] and ".so" in parts[5]:
                    return parts[5].strip()
    except OSError:
        pass
    return None


def _native_reader() -> Any:
    """A ``native_zmq_read.Reader`` on pyzmq's libzmq, or None (not built, the library not found, a symbol missing:
    the listener reads through pyzmq)."""
    path = _libzmq_path()
    if path is None:
        return None
    try:
        from sgl_moe.router.membership.native_zmq_read import Reader

        return Reader(path)
    except (ImportError, OSError) as exc:
        logger.debug("KV events read through pyzmq: %s", exc)
        return None


READER = _native_reader()
NATIVE = READER is not None
"""Whether KV-event messages are read in C (``native_zmq_read``)."""
