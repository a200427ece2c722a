"""The virtual clock: events ordered by time, run one after another; nothing sleeps.

Events at the same time run in the order they were scheduled, so a run is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class Timeline:
    """A heap of ``(time, sequence, callback, argument)``; ``now`` is the time of the event running."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.events_run = 0

    def __call__(self) -> float:
        """The clock the router's scheduler reads."""
        return self.now

    def at(self, t: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``callback(arg)`` at time ``t`` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (t if t > self.now else self.now, self._seq, callback, arg))

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run events in time order until none is left (or ``until()`` turns true after one)."""
        heap, pop = self._heap, heapq.heappop
        while heap:
            t, _, callback, arg = pop(heap)
            self.now = t
            callback(arg)
            self.events_run += 1
            if until is not None and until():
                return

    def __len__(self) -> int:
        return len(self._heap)
