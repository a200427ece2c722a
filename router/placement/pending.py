"""Request-level bookkeeping of the pending table: who promised which blocks, and when to retire them.

A request routed to a target promises the blocks of its prompts there (so a burst of same-prefix
requests converges before any KV event arrives). The promise is retired when the request has
completed *and* every promised block is in the target's committed table, at once if the request
failed or was aborted, and by a TTL after completion only as a safety net (events lost, blocks
evicted before they were reported, KV cache disabled).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Protocol

from sgl_moe.router.placement.block_index import BlockIndex


@dataclass(eq=False, slots=True)
class Promise:
    rid: str
    slot: int
    keys: list[int]
    completed_at: float | None = None
    serial: int = 0
    """The ledger's number for it (other router replicas name it by this: ``replicas``)."""


class LedgerObserver(Protocol):
    """Told of every promise made and retired (the replica link publishes them to the other replicas)."""

    def promised(self, p: Promise) -> None: ...

    def retired(self, p: Promise) -> None: ...


@dataclass
class PendingStats:
    promised: int = 0
    retired_stored: int = 0
    retired_failed: int = 0
    retired_ttl: int = 0


@dataclass
class PendingLedger:
    index: BlockIndex
    ttl_s: float
    stats: PendingStats = field(default_factory=PendingStats)
    _awaiting_store: dict[int, list[Promise]] = field(default_factory=dict)
    observer: LedgerObserver | None = None
    _serials: itertools.count = field(default_factory=itertools.count)

    def promise(self, rid: str, slot: int, keys: list[int]) -> Promise:
        self.index.promise(slot, keys)
        self.stats.promised += 1
        p = Promise(rid, slot, keys, serial=next(self._serials))
        if self.observer is not None:
            self.observer.promised(p)
        return p

    def complete(self, p: Promise, now: float | None = None) -> None:
        p.completed_at = time.monotonic() if now is None else now
        index = self.index
        if index.all_committed(p.slot, p.keys):
            index.retire(p.slot, p.keys)
            self.stats.retired_stored += 1
            if self.observer is not None:
                self.observer.retired(p)
        else:
            waiting = self._awaiting_store.get(p.slot)
            if waiting is None:
                self._awaiting_store[p.slot] = [p]
            else:
                waiting.append(p)

    def fail(self, p: Promise) -> None:
        self._retire(p)
        self.stats.retired_failed += 1

    def on_stored(self, slot: int) -> None:
        """The target reported stored blocks: retire completed promises now fully committed."""
        waiting = self._awaiting_store.get(slot)
        if not waiting:
            return
        keep = []
        all_committed, retire, observer = self.index.all_committed, self.index.retire, self.observer
        for p in waiting:
            if all_committed(slot, p.keys):
                retire(slot, p.keys)
                if observer is not None:
                    observer.retired(p)
            else:
                keep.append(p)
        self.stats.retired_stored += len(waiting) - len(keep)
        self._awaiting_store[slot] = keep

    def expire(self, now: float | None = None) -> int:
        """Retire completed promises older than the TTL; returns how many."""
        now = time.monotonic() if now is None else now
        expired = 0
        for slot, waiting in self._awaiting_store.items():
            keep = []
            for p in waiting:
                if now - (p.completed_at or now) >= self.ttl_s:
                    self._retire(p)
                    expired += 1
                else:
                    keep.append(p)
            self._awaiting_store[slot] = keep
        self.stats.retired_ttl += expired
        return expired

    def forget_slot(self, slot: int) -> None:
        """The target is gone (its tables are purged by the index)."""
        gone = self._awaiting_store.pop(slot, None)
        if gone and self.observer is not None:
            for p in gone:
                self.observer.retired(p)

    def _retire(self, p: Promise) -> None:
        self.index.retire(p.slot, p.keys)
        if self.observer is not None:
            self.observer.retired(p)
