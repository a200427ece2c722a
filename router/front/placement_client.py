"""A front process's connection to the placement owner (``--front-processes N``): ``place`` a parsed request,
``release`` or ``cancel`` it, and the owner's ``Model`` updates."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

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
        self._outbox: Outbox | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._next = 0
        self._reader_task: asyncio.Task | None = None
        self.lost = False

    async def connect(self, path: str) -> None:
        reader, self._writer = await asyncio.open_unix_connection(path)
        self._outbox = Outbox(self._writer)
        self._outbox.put(Hello(VERSION, self.front))
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()

    async def place(self, rid: str, prompt_lens: list[int], keys: list[list[int]], shared_prefix_len: int,
                    max_new_tokens: int, fingerprint: bytes) -> tuple[int, Placed | Refused | Delegate]:
        """(request number, the owner's answer). The message is queued before the first await, so requests are
        placed in the order this front calls ``place`` (its outbox keeps that order). Cancelled (the client
        left): the owner is told."""
        if self.lost:
            raise OwnerGone("the placement owner is gone")
        req = self._next
        self._next += 1
        future = asyncio.get_running_loop().create_future()
        self._waiting[req] = future
        self._outbox.put(Place(req, rid, prompt_lens, keys, shared_prefix_len, max_new_tokens, fingerprint))
        try:
            return req, await future
        except asyncio.CancelledError:
            if not self.lost:
                self._outbox.put(Cancel(req))
            raise
        finally:
            self._waiting.pop(req, None)

    def release(self, req: int, ok: bool, reported_cached_tokens: int = -1) -> None:
        if not self.lost:
            self._outbox.put(Release(req, ok, reported_cached_tokens))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await read_to_front(reader)
                if isinstance(msg, Model):
                    self.on_model(msg)
                    continue
                future = self._waiting.get(msg.req)
                if future is not None and not future.done():
                    future.set_result(msg)
                elif isinstance(msg, Placed):  # its client left meanwhile: the Cancel is on its way
                    pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("front %d: unreadable message from the placement owner", self.front)
        self.lost = True
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(OwnerGone("the placement owner is gone"))
        self.on_lost()
