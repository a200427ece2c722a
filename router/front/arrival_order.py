"""Requests reach placement in the order their bodies arrived, though some are parsed in threads.

A request takes a ticket when its body has arrived, and waits for its turn before it is placed; it gives the
turn on (``leave``) once its placement or its place in the FIFO queue is made, or when it ends early (a 4xx,
the client gone). Parsing, tokenizing and hashing may then run on other cores (the tokenizers library releases
the GIL) without a small request overtaking a large one that arrived before it: placement sees the arrival
order a router that parses everything on its event loop sees.
"""

from __future__ import annotations

import asyncio


class ArrivalOrder:
    """Tickets in arrival order; ``wait_turn`` returns once every earlier ticket has left."""

    def __init__(self) -> None:
        self._issued = 0
        self._turn = 0
        """The oldest ticket that has not left."""
        self._left: set[int] = set()
        """Tickets that left before their turn (they ended early)."""
        self._waiting: dict[int, asyncio.Future[None]] = {}

    def ticket(self) -> int:
        self._issued += 1
        return self._issued - 1

    @property
    def waiting(self) -> int:
        """Requests parsed and waiting for an earlier one."""
        return len(self._waiting)

    def is_turn(self, ticket: int) -> bool:
        """``ticket`` is the oldest one still here (``wait_turn`` would return at once)."""
        return ticket == self._turn

    async def wait_turn(self, ticket: int) -> None:
        """Returns when ``ticket`` is the oldest one still here (at once, without yielding, when it already is)."""
        if ticket == self._turn:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = future
        try:
            await future
        finally:
            self._waiting.pop(ticket, None)

    def leave(self, ticket: int) -> None:
        """``ticket`` is placed, queued or done: the next one may go (idempotent)."""
        if ticket < self._turn or ticket in self._left:
            return
        self._left.add(ticket)
        while self._turn in self._left:
            self._left.discard(self._turn)
            self._turn += 1
        future = self._waiting.get(self._turn)
        if future is not None and not future.done():
            future.set_result(None)
