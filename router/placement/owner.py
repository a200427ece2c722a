"""The placement owner's side of ``--front-processes N``: it serves the fronts' ``Place``/``Release``/``Cancel``
messages (``messages``) on a Unix socket, against the one scheduler that holds the committed and pending tables,
the in-flight FLOPs per worker (Θ) and the FIFO queue.

Each front keeps one connection. A ``Place`` becomes a ``Job`` and goes through the same ``acquire`` as a
request the owner takes itself, so requests queue in one queue whichever front took them, in the order their
``Place`` messages arrive. A front that goes away (its connection ends) releases everything it held. The same
``FrontSession`` serves the other router replicas' requests when this router is their placement owner
(``--peers``, ``replicas.shared_placement``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from sgl_moe.router.placement.job import Job, Placement
from sgl_moe.router.placement.messages import (
    VERSION,
    Cancel,
    Delegate,
    Hello,
    Model,
    Outbox,
    Place,
    Placed,
    Refused,
    Release,
    place_keys,
    read_to_owner,
)

log = logging.getLogger("sgl_moe.router.fronts")


@dataclass(frozen=True)
class Screen:
    """What the owner says of a request before placing it, from its fingerprint (``suspects``)."""

    verdict: Literal["place", "refuse", "delegate"]
    message: str = ""
    """For ``refuse``: the 400's message (a poison request)."""


class PlacementOwner:
    """Places requests for front processes (a hook object: the router's ``start`` makes it when
    ``--front-processes`` > 1)."""

    def __init__(self, acquire: Callable[[Job], Awaitable[Placement]], release: Callable[..., None],
                 refusal: Callable[[Exception], Refused | None], screen: Callable[[bytes], Screen],
                 observe: Callable[[Placement], None], model: Callable[[], Model]) -> None:
        self.acquire = acquire
        """``Scheduler.acquire``."""
        self.release = release
        """``Scheduler.release(placement, ok=...)``."""
        self.refusal = refusal
        """A refusal for a placement error (queue full, timeout, no workers), or None: not a refusal."""
        self.screen = screen
        self.observe = observe
        """Record a placement's decision and queue time (metrics)."""
        self.model = model
        self.fronts: dict[int, Outbox] = {}
        """Connected fronts by connection number."""
        self._last_model: Model | None = None
        self._model_key: object = None
        self._server: asyncio.AbstractServer | None = None
        self._next_conn = 0
        self.placed = 0
        """Placements made for fronts."""

    async def serve(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._connection, path=path)
        os.chmod(path, 0o600)  # the router's own user only: messages are trusted

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for outbox in self.fronts.values():
            outbox.writer.close()

    def refresh_model(self, key: object) -> None:
        """Send every front the model state when it changed (a worker joined or left, the tokenizer changed).
        ``key``: a cheap summary of that state; the message is built only when it differs from the last one."""
        if key == self._model_key:
            return
        self._model_key = key
        model = self.model()
        if model == self._last_model:
            return
        self._last_model = model
        for outbox in self.fronts.values():
            outbox.put(model)

    def session(self, outbox: Outbox, name: str) -> FrontSession:
        """The state of one front's placements (a front process's connection, or another router replica's
        requests through the broker: ``replicas.shared_placement``), answering through ``outbox``."""
        return FrontSession(self, outbox, name)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self._next_conn
        self._next_conn += 1
        session: FrontSession | None = None
        front = "?"
        try:
            hello = await read_to_owner(reader)
            if not isinstance(hello, Hello) or hello.version != VERSION:
                log.error("refusing a front connection: it sent %r, not Hello(version=%d)", hello, VERSION)
                return
            front = str(hello.front)
            outbox = Outbox(writer)
            session = self.session(outbox, f"front {front}")
            self.fronts[conn] = outbox
            outbox.put(self.model())
            log.info("front %s connected", front)
            while True:
                session.handle(await read_to_owner(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:  # a broken frame: this front is dropped, the router goes on
            log.exception("front %s sent a message the owner cannot read; dropping its connection", front)
        finally:
            self.fronts.pop(conn, None)
            if session is not None:
                session.close("went away")
            writer.close()


class FrontSession:
    """One front's requests at the owner: ``Place`` answered with ``Placed``/``Refused``/``Delegate`` through its
    outbox, ``Release`` and ``Cancel`` settled; ``close`` releases everything it still holds."""

    def __init__(self, owner: PlacementOwner, outbox: Outbox, name: str) -> None:
        self.owner = owner
        self.outbox = outbox
        """Anything with ``put(message)``."""
        self.name = name
        self.placements: dict[int, Placement] = {}
        self.pending: dict[int, asyncio.Task] = {}
        """Requests being placed (queued at the owner), by the front's number."""

    def handle(self, msg: object) -> None:
        if isinstance(msg, Place):
            task = asyncio.get_running_loop().create_task(self._place(msg))
            self.pending[msg.req] = task
            task.add_done_callback(lambda _t, req=msg.req: self.pending.pop(req, None))
        elif isinstance(msg, Release):
            placement = self.placements.pop(msg.req, None)
            if placement is not None:
                self._settle(placement, msg)
        elif isinstance(msg, Cancel):
            task = self.pending.pop(msg.req, None)
            if task is not None:
                task.cancel()
            placement = self.placements.pop(msg.req, None)
            if placement is not None:
                self.owner.release(placement, ok=False)

    def close(self, why: str) -> None:
        """The front is gone: cancel its waiting requests, release its placements."""
        pending, placements = list(self.pending.values()), list(self.placements.values())
        self.pending.clear()
        self.placements.clear()
        for task in pending:
            task.cancel()
        for placement in placements:
            self.owner.release(placement, ok=False)
        if placements or pending:
            log.warning("%s %s holding %d placement(s) and %d waiting request(s): released", self.name, why,
                        len(placements), len(pending))

    async def _place(self, msg: Place) -> None:
        owner, outbox = self.owner, self.outbox
        screen = owner.screen(msg.fingerprint)
        if screen.verdict == "refuse":
            outbox.put(Refused(msg.req, 400, screen.message, "request_failed"))
            return
        if screen.verdict == "delegate":
            outbox.put(Delegate(msg.req))
            return
        try:
            keys = place_keys(msg)
        except ValueError as exc:  # answered, not left to the front's wait
            log.error("%s sent request %s with unreadable block hashes: %s", self.name, msg.rid, exc)
            outbox.put(Refused(msg.req, 400, f"unreadable block hashes: {exc}", "request_failed"))
            return
        job = Job(rid=msg.rid, prompt_lens=msg.prompt_lens, keys=keys, shared_prefix_len=msg.shared_prefix_len,
                  max_new_tokens=msg.max_new_tokens)
        try:
            placement = await owner.acquire(job)
        except Exception as exc:
            refused = owner.refusal(exc)
            if refused is None:
                raise
            outbox.put(Refused(msg.req, refused.status, refused.message, refused.kind, refused.retry_after))
            return
        owner.observe(placement)
        owner.placed += 1
        self.placements[msg.req] = placement
        outbox.put(Placed(msg.req, placement.worker.id, placement.worker.url, placement.predicted_cached_tokens,
                          placement.queued_s, placement.decision_s, placement.reason))

    def _settle(self, placement: Placement, msg: Release) -> None:
        if msg.reported_cached_tokens >= 0:
            c = placement.worker.counters
            c.predicted_cached_tokens += placement.predicted_cached_tokens
            c.reported_cached_tokens += msg.reported_cached_tokens
        if msg.ok:
            placement.worker.last_progress = time.monotonic()
        self.owner.release(placement, ok=msg.ok)
