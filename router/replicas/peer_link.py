"""This router's link to its replicas through a NATS broker (``--peers nats://HOST:PORT``).

It publishes what this router adds to the shared picture, its own promises and retirements (``PendingLedger``'s
observer) and its own in-flight FLOPs per worker and queue length (``Scheduler.on_load``), as one ``Batch`` per
turn of the event loop, plus a heartbeat every ``heartbeat_s``; it folds what the other replicas publish into this
router's tables (``PeerTables``). On connecting (and on every reconnect) it says ``Hello`` and sends its
``Snapshot``; every replica answers a ``Hello`` with its own, so a replica started late, or back after a broker
outage, catches up before the next request. With the broker unreachable the router serves on its own state (its
peers' shares expire after ``--peer-timeout-s``), says so in ``GET /workers`` and ``/metrics``, and keeps
reconnecting. Messages are core NATS (at most once): a gap in a peer's sequence asks for its snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import nats
from nats.errors import Error as NatsError

from sgl_moe.router.placement.pending import Promise
from sgl_moe.router.replicas.messages import (
    VERSION,
    Answers,
    Batch,
    Bye,
    Hello,
    Load,
    Promised,
    Requests,
    Retired,
    Snapshot,
    Update,
    decode,
    encode,
)
from sgl_moe.router.replicas.peer_tables import PeerTables

log = logging.getLogger("sgl_moe.router.replicas")

CONNECT_RETRY_S = 1.0
HELLO_EVERY_S = 1.0
"""At most one ``Hello`` for missing state per this long (each makes every replica publish its snapshot)."""


def public_url(url: str) -> str:
    """``url`` without credentials (for logs and ``GET /workers``)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class PeerLink:
    def __init__(self, *, url: str, subject: str, replica: str | None, token: str | None, tables: PeerTables,
                 where: Callable[[int], tuple[str, int] | None], own_load: Callable[[], Load],
                 heartbeat_s: float) -> None:
        self.url = url
        self.subject = subject
        self.replica = replica or f"{os.uname().nodename}-{os.getpid()}-{os.urandom(3).hex()}"
        """This router's name among the replicas (unique per process unless given)."""
        self.token = token
        self.tables = tables
        self.where = where
        """Slot -> (worker URL, DP rank), None for a slot whose worker left."""
        self.own_load = own_load
        self.heartbeat_s = heartbeat_s
        self.since = time.time()
        """When this replica started (``Snapshot.since``: the replica up longest owns placement)."""
        self.placing: Any = None
        """``SharedPlacement`` with one placement owner (``--replica-placement owner``), else None."""
        self.state = "connecting"
        """``connecting`` (never reached the broker yet), ``connected``, or ``unreachable``."""
        self.published = 0
        self.received = 0
        self.dropped_version = 0
        self.undecodable = 0
        self.disconnects = 0
        self._nc: Any = None
        self._own: dict[int, Promised] = {}
        """This router's open promises, as published."""
        self._updates: list[Update] = []
        self._load_due = False
        self._flush_due = False
        self._seq = 0
        self._tasks: list[asyncio.Task] = []
        self._sending: set[asyncio.Future] = set()
        self._closing = False
        self._last_hello = -HELLO_EVERY_S
        self._started_at: float | None = None
        self._connected_at: float | None = None

    # -- this router's changes (hooks) -----------------------------------------------------------
    def promised(self, p: Promise) -> None:
        at = self.where(p.slot)
        if at is None:
            return
        msg = Promised(p.serial, at[0], at[1], list(p.keys))
        self._own[p.serial] = msg
        self._put(msg)

    def retired(self, p: Promise) -> None:
        if self._own.pop(p.serial, None) is not None:
            self._put(Retired(p.serial))

    def load_changed(self, _worker: Any = None) -> None:
        if not self._load_due:
            self._load_due = True
            self._schedule_flush()

    def _put(self, update: Update) -> None:
        self._updates.append(update)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            try:
                asyncio.get_running_loop().call_soon(self._flush)
            except RuntimeError:  # no loop (a unit test driving the scheduler): flushed by the next call
                self._flush_due = False

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect in the background: the router serves alone until the broker answers."""
        self._started_at = asyncio.get_running_loop().time()
        self._tasks.append(asyncio.create_task(self._connect_loop(), name="peers-connect"))
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="peers-heartbeat"))

    async def close(self) -> None:
        self._closing = True
        for t in self._tasks:
            t.cancel()
        nc = self._nc
        if nc is not None and nc.is_connected:
            try:
                await nc.publish(self.subject, encode(Bye(VERSION, self.replica)))
                await nc.flush(timeout=1)
            except (NatsError, TimeoutError, OSError):
                pass
        if nc is not None:
            try:
                await nc.close()
            except (NatsError, TimeoutError, OSError):
                pass

    async def _connect_loop(self) -> None:
        shown = public_url(self.url)
        while not self._closing:
            try:
                self._nc = await nats.connect(
                    servers=[self.url], token=self.token, name=f"sgl_moe-router {self.replica}", no_echo=True,
                    allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=CONNECT_RETRY_S,
                    connect_timeout=2, disconnected_cb=self._on_disconnected, reconnected_cb=self._on_reconnected,
                    error_cb=self._on_error)
            except (NatsError, OSError, TimeoutError) as exc:
                if self.state != "unreachable":
                    log.warning("replica broker %s unreachable (%s); serving on this router's own state, retrying "
                                "every %g s", shown, exc or type(exc).__name__, CONNECT_RETRY_S)
                self.state = "unreachable"
                await asyncio.sleep(CONNECT_RETRY_S)
                continue
            await self._nc.subscribe(self.subject, cb=self._on_message)
            await self._nc.subscribe(self.direct_subject(self.replica), cb=self._on_message)
            log.info("replica %s joined %s on %s", self.replica, self.subject, shown)
            await self._on_reconnected()
            return

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        self.disconnects += 1
        self.state = "unreachable"
        if self.placing is not None:
            self.placing.broker_lost()
        log.warning("replica broker %s lost; serving on this router's own state (peers' shares expire after "
                    "%g s) and reconnecting", public_url(self.url), self.tables.timeout_s)

    def connected(self) -> bool:
        return self.state == "connected" and self._nc is not None and self._nc.is_connected

    def warm(self) -> bool:
        """Whether this replica holds the others' state: connected for a heartbeat (the snapshots a ``Hello`` asks
        for arrive within milliseconds), or ``--peer-timeout-s`` gone by without the broker (it serves alone).
        ``GET /health`` answers 503 until then, so a load balancer sends a late replica nothing before."""
        now = asyncio.get_running_loop().time()
        if self.state == "connected" and self._connected_at is not None:
            return now - self._connected_at >= self.heartbeat_s
        return self._started_at is not None and now - self._started_at >= self.tables.timeout_s

    async def _on_reconnected(self) -> None:
        if self.placing is not None:
            self.placing.broker_lost()  # what was sent while away never arrived
        if self.state == "unreachable":
            log.warning("replica broker %s reached again: sharing state with the other replicas",
                        public_url(self.url))
        self.state = "connected"
        self._connected_at = asyncio.get_running_loop().time()
        await self._publish(Hello(VERSION, self.replica, joined=True))
        await self._publish(self._snapshot())

    async def _on_error(self, exc: Exception) -> None:
        """nats-py keeps trying to (re)connect by itself and reports each failure here."""
        connected = self._nc is not None and self._nc.is_connected
        if connected or self._closing:
            log.debug("replica broker: %s", exc)
            return
        if self.state != "unreachable":
            hint = " (check --peers-token or the URL's user:password)" if "authoriz" in str(exc).lower() else ""
            log.warning("replica broker %s unreachable: %s%s; serving on this router's own state and retrying "
                        "every %g s", public_url(self.url), exc or type(exc).__name__, hint, CONNECT_RETRY_S)
        self.state = "unreachable"

    # -- publishing ------------------------------------------------------------------------------
    def _snapshot(self) -> Snapshot:
        self._seq += 1
        return Snapshot(VERSION, self.replica, self._seq, list(self._own.values()), self.own_load(), self.since)

    def _flush(self) -> None:
        self._flush_due = False
        updates, self._updates = self._updates, []
        if self._load_due:
            self._load_due = False
            updates.append(self.own_load())
        if not updates or self.state != "connected":
            return  # while the broker is away the next snapshot carries the state
        self._seq += 1
        task = asyncio.ensure_future(self._publish(Batch(VERSION, self.replica, self._seq, updates)))
        self._sending.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._sending.discard)

    def direct_subject(self, replica: str) -> str:
        """The subject only ``replica`` reads (placement requests and answers)."""
        return f"{self.subject}.to.{replica}"

    def send(self, replica: str, message: Requests | Answers) -> None:
        """Publish ``message`` to ``replica`` alone, split when it is over the broker's payload limit."""
        task = asyncio.ensure_future(self._send(replica, message))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, replica: str, message: Requests | Answers) -> None:
        data = encode(message)
        nc = self._nc
        limit = nc.max_payload if nc is not None and nc.is_connected else 0
        if limit and len(data) > limit and len(message.items) > 1:
            half = len(message.items) // 2
            for part in (message.items[:half], message.items[half:]):
                await self._send(replica, type(message)(message.version, message.replica, part))
            return
        await self._publish(message, self.direct_subject(replica), data)

    async def _publish(self, message: Any, subject: str | None = None, data: bytes | None = None) -> None:
        nc = self._nc
        if nc is None or not nc.is_connected:
            return
        try:
            await nc.publish(subject or self.subject, data if data is not None else encode(message))
            self.published += 1
        except (NatsError, OSError) as exc:
            log.warning("replica broker: publish of a %s failed (%s)", type(message).__name__, exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            self.tables.expire()
            self.tables.resolve()
            self.load_changed()

    # -- receiving -------------------------------------------------------------------------------
    async def _on_message(self, msg: Any) -> None:
        self.received += 1
        try:
            m = decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.undecodable += 1
            return
        if m.version != VERSION:
            self.dropped_version += 1
            if self.dropped_version == 1:
                log.warning("replica %s speaks version %d of the replica messages, this router %d: ignored",
                            m.replica, m.version, VERSION)
            return
        if m.replica == self.replica:
            return
        if isinstance(m, Requests):
            if self.placing is not None:
                self.placing.on_requests(m.replica, m.items)
        elif isinstance(m, Answers):
            if self.placing is not None:
                self.placing.on_answers(m.replica, m.items)
        elif isinstance(m, Batch):
            if not self.tables.apply_batch(m.replica, m.seq, m.updates):
                now = asyncio.get_running_loop().time()
                if now - self._last_hello >= HELLO_EVERY_S:
                    self._last_hello = now
                    await self._publish(Hello(VERSION, self.replica))
        elif isinstance(m, Snapshot):
            self.tables.apply_snapshot(m.replica, m.seq, m.promised, m.load, m.since)
        elif isinstance(m, Hello):
            if self.placing is not None and m.joined:
                self.placing.peer_restarted(m.replica)
            await self._publish(self._snapshot())
        elif isinstance(m, Bye):
            self.tables.drop(m.replica, "it stopped")

    # -- views -----------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {"broker": public_url(self.url), "subject": self.subject, "replica": self.replica,
                "state": self.state, "own_promises": len(self._own), "published": self.published,
                "received": self.received, "gaps": self.tables.stats.gaps, "expired": self.tables.stats.expired,
                "disconnects": self.disconnects, "undecodable": self.undecodable,
                "other_version": self.dropped_version,
                "placement": self.placing.describe() if self.placing is not None else "shared tables",
                "replicas": self.tables.describe()}
