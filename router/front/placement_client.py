"""A front process's connection to the placement owner (``--front-processes N``): ``place`` a parsed request,
``release`` or ``cancel`` it, and the owner's ``Model`` updates."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

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
    ToFront,
    read_to_front,
)

log = logging.getLogger("sgl_moe.router.fronts")


class OwnerGone(Exception):
    """The connection to the placement owner ended (the owner stopped): this front cannot place anything."""


class PlacementClient:
    def __init__(self, front: int, on_model: Callable[[Model], None], on_lost: Callable[[], None]) -> None:
        self.front = front
        self.on_model = on_model
        """Called with each ``Model`` the owner sends (the first right after connecting)."""
        self.on_lost = on_lost
        """Called once when the owner's connection ends."""
        self._writer: asyncio.StreamWriter | None = None
        self._outbox: Any = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._next = 0
        self._reader_task: asyncio.Task | None = None
        self.lost = False

    async def connect(self, path: str) -> None:
        """Talk to the owner of this router's front processes on its Unix socket."""
        reader, self._writer = await asyncio.open_unix_connection(path)
        self.attach(Outbox(self._writer))
        self._outbox.put(Hello(VERSION, self.front))
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    def attach(self, outbox: Any) -> None:
        """Send through ``outbox`` (anything with ``put(message)``); answers come in through ``deliver``."""
        self._outbox = outbox

    def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()

    async def place(self, rid: str, prompt_lens: list[int], keys: list[list[int]], shared_prefix_len: int,
                    max_new_tokens: int, fingerprint: bytes, timeout_s: float | None = None
                    ) -> tuple[int, Placed | Refused | Delegate]:
        """(request number, the owner's answer). The message is queued before the first await, so requests are
        placed in the order this front calls ``place`` (its outbox keeps that order). Cancelled (the client
        left), or no answer within ``timeout_s`` (``OwnerGone``; a message lost on the way): the owner is told."""
        if self.lost:
            raise OwnerGone("the placement owner is gone")
        req = self._next
        self._next += 1
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting[req] = future
        self._outbox.put(Place(req, rid, prompt_lens, keys, shared_prefix_len, max_new_tokens, fingerprint))
        timer = None
        if timeout_s is not None:
            def expire() -> None:
                if not future.done():
                    future.set_exception(OwnerGone(f"no answer from the placement owner within {timeout_s:g} s"))
                    if not self.lost:
                        self._outbox.put(Cancel(req))
            timer = loop.call_later(timeout_s, expire)
        try:
            return req, await future
        except asyncio.CancelledError:
            if not self.lost:
                self._outbox.put(Cancel(req))
            raise
        finally:
            self._waiting.pop(req, None)
            if timer is not None:
                timer.cancel()

    def release(self, req: int, ok: bool, reported_cached_tokens: int = -1) -> None:
        if not self.lost:
            self._outbox.put(Release(req, ok, reported_cached_tokens))

    def deliver(self, msg: ToFront) -> None:
        """An answer from the owner."""
        if isinstance(msg, Model):
            self.on_model(msg)
            return
        future = self._waiting.get(msg.req)
        if future is not None and not future.done():
            future.set_result(msg)
        # else a Placed whose client left meanwhile: the Cancel is on its way

    def lose(self) -> None:
        """The owner is gone: every request waiting for it fails with ``OwnerGone``; ``on_lost`` is called once."""
        if self.lost:
            return
        self.lost = True
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(OwnerGone("the placement owner is gone"))
        self.on_lost()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self.deliver(await read_to_front(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("front %d: unreadable message from the placement owner", self.front)
        self.lose()
