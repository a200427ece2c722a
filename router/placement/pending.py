"""Request-level bookkeeping of the pending table: who promised which blocks, and when to retire them.

A request routed to a target promises the blocks of its prompts there (so a burst of same-prefix
requests converges before any KV event arrives). The promise is retired when the request has
completed *and* every promised block is in the target's committed table, at once if the request
failed or was aborted, and by a TTL after completion only as a safety net (events lost, blocks
evicted before they were reported, KV cache disabled).

A completed promise not yet fully committed waits on its first uncommitted block: only a batch of KV events that
stores that block can complete it, so a batch wakes the promises waiting on the blocks it stored and no others
(checking every waiting promise on every batch cost the router ~0.2 ms a request in front of workers that publish
events, with a few hundred promises waiting). A woken promise is checked whole again, as before.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sgl_moe.router.placement.block_index import BlockIndex


@dataclass(eq=False, slots=True, init=False)
class Promise:
    rid: str
    slot: int
    keys: Sequence[int]
    completed_at: float | None = None
    serial: int = 0
    """The ledger's number for it (other router replicas name it by this: ``replicas``)."""
    waiting_on: int | None = None
    """The uncommitted block it waits on, completed (``PendingLedger``); None otherwise."""
    retired: bool = False

    def __init__(self, rid: str, slot: int, keys: Sequence[int], completed_at: float | None = None, serial: int = 0,
                 waiting_on: int | None = None, retired: bool = False) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.rid = rid
        self.slot = slot
        self.keys = keys
        self.completed_at = completed_at
        self.serial = serial
        self.waiting_on = waiting_on
        self.retired = retired


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
    """Per target, the completed promises not retired when they completed, in completion order (for the TTL)."""
    _store_waiters: dict[int, dict[int, list[Promise]]] = field(default_factory=dict)
    """Per target, uncommitted block -> the completed promises waiting on it (``Promise.waiting_on``)."""
    observer: LedgerObserver | None = None
    _serials: itertools.count = field(default_factory=itertools.count)

    def promise(self, rid: str, slot: int, keys: Sequence[int]) -> Promise:
        self.index.promise(slot, keys)
        self.stats.promised += 1
        p = Promise(rid, slot, keys, serial=next(self._serials))
        if self.observer is not None:
            self.observer.promised(p)
        return p

    def complete(self, p: Promise, now: float | None = None) -> None:
        p.completed_at = time.monotonic() if now is None else now
        if not self.index.has_target(p.slot):  # its worker was removed while the request ran: tables purged
            p.retired = True
            if self.observer is not None:
                self.observer.retired(p)
            return
        if not self._retire_or_wait(p):
            waiting = self._awaiting_store.get(p.slot)
            if waiting is None:
                self._awaiting_store[p.slot] = [p]
            else:
                waiting.append(p)

    def fail(self, p: Promise) -> None:
        self._retire(p)
        self.stats.retired_failed += 1

    def on_stored(self, slot: int, gained: Iterable[int]) -> None:
        """The target's committed table gained ``gained`` (``BlockIndex.store``'s answers for one batch of KV
        events): retire the completed promises that waited on one of them and are now fully committed; the others
        wait on their next uncommitted block."""
        waiters = self._store_waiters.get(slot)
        if not waiters:
            return
        woken = []
        for h in gained:
            ps = waiters.pop(h, None)
            if ps is not None:
                woken += ps
        for p in woken:
            if not p.retired:
                p.waiting_on = None
                self._retire_or_wait(p)

    def expire(self, now: float | None = None) -> int:
        """Retire completed promises older than the TTL; returns how many."""
        now = time.monotonic() if now is None else now
        expired = 0
        for slot, waiting in self._awaiting_store.items():
            keep = []
            for p in waiting:
                if p.retired:  # by its blocks' KV events meanwhile
                    continue
                if now - (p.completed_at or now) >= self.ttl_s:
                    self._unwait(p)
                    self._retire(p)
                    expired += 1
                else:
                    keep.append(p)
            self._awaiting_store[slot] = keep
        self.stats.retired_ttl += expired
        return expired

    def _retire_or_wait(self, p: Promise) -> bool:
        """Retire ``p`` if every block it promised is committed (True); else it waits on its first block that is
        not (False)."""
        index, keys = self.index, p.keys
        done = index.committed_prefix(p.slot, keys)
        if done == len(keys):
            index.retire(p.slot, keys)
            p.retired = True
            self.stats.retired_stored += 1
            if self.observer is not None:
                self.observer.retired(p)
            return True
        h = p.waiting_on = keys[done]
        waiters = self._store_waiters.get(p.slot)
        if waiters is None:
            self._store_waiters[p.slot] = {h: [p]}
        else:
            ps = waiters.get(h)
            if ps is None:
                waiters[h] = [p]
            else:
                ps.append(p)
        return False

    def _unwait(self, p: Promise) -> None:
        waiters = self._store_waiters.get(p.slot)
        if p.waiting_on is None or waiters is None:
            return
        ps = waiters.get(p.waiting_on)
        if ps is not None:
            ps.remove(p)
            if not ps:
                del waiters[p.waiting_on]
        p.waiting_on = None

    def forget_slot(self, slot: int) -> None:
        """The target is gone (its tables are purged by the index)."""
        gone = self._awaiting_store.pop(slot, None)
        self._store_waiters.pop(slot, None)
        for p in gone or ():
            if not p.retired:
                p.retired = True
                if self.observer is not None:
                    self.observer.retired(p)

    def _retire(self, p: Promise) -> None:
        p.retired = True
        self.index.retire(p.slot, p.keys)
        if self.observer is not None:
            self.observer.retired(p)
