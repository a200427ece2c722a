"""One worker's KV cache as the router sees it: a radix cache of pages with LRU eviction.

Pages are identified by their block hash (a hash chains its parents, so a set of hashes is a radix
tree). A running request locks the pages of its prefix; unlocked pages sit in an LRU order from which
eviction takes the oldest. Whenever a request touches a chain it releases the deepest page first,
so a parent is always younger than its children and eviction never orphans a page (SGLang's radix
cache likewise evicts leaves only).

Capacity counts tree pages plus pages reserved for the tokens running requests still compute (SGLang
allocates them from the same pool). Inserts and evictions are collected for the worker's KV events.

``KVCacheModel`` is the model in Python. The C extension ``native_kv_cache`` (``native_kv_cache.c``, built at install)
is the same model with the same methods and answers (``KVPages``), and ``new_kv_cache`` gives it when it was built;
``KVCacheModel`` is also its reference in the tests (``tests/simulator/test_native_kv_cache.py``). ``NATIVE`` says
which one runs.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice

try:
    from sgl_moe.simulator import native_kv_cache
except ImportError:  # no C compiler at install: the Python model below
    native_kv_cache = None

NATIVE = native_kv_cache is not None


class KVCacheModel:
    """Pages by hash with lock counts; ``stored`` / ``removed`` collect hashes for the next KV event."""

    def __init__(self, capacity_pages: int) -> None:
        if capacity_pages < 1:
            raise ValueError(f"capacity must be at least one page, got {capacity_pages}")
        self.capacity = capacity_pages
        self.locks: dict[int, int] = {}
        """Every page in the tree -> how many running requests hold it (0: evictable, in ``lru``)."""
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.reserved = 0
        self.stored: list[int] = []
        self.removed: list[int] = []
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.locks)

    @property
    def free(self) -> int:
        return self.capacity - len(self.locks) - self.reserved

    def match(self, hashes: list[int]) -> int:
        """Leading pages of ``hashes`` in the tree."""
        locks = self.locks
        n = 0
        for h in hashes:
            if h not in locks:
                break
            n += 1
        return n

    def match_lock(self, hashes: list[int], limit: int) -> int:
        """``lock`` the leading pages of ``hashes`` in the tree, at most ``limit``; returns how many (``match`` capped
        at ``limit``, locked in the same pass)."""
        locks, lru = self.locks, self.lru
        get = locks.get
        n = 0
        for h in hashes if len(hashes) <= limit else islice(hashes, limit):
            c = get(h)
            if c is None:
                break
            if not c:
                del lru[h]
            locks[h] = c + 1
            n += 1
        return n

    def lock(self, hashes: list[int]) -> None:
        """A running request holds these pages (all in the tree)."""
        locks, lru = self.locks, self.lru
        for h in hashes:
            c = locks[h]
            if not c:
                del lru[h]
            locks[h] = c + 1

    def unlock(self, hashes: list[int]) -> None:
        """Release pages locked by ``lock`` / ``insert``; deepest first, so parents end up youngest."""
        locks, lru = self.locks, self.lru
        for h in reversed(hashes):
            c = locks[h] - 1
            locks[h] = c
            if not c:
                lru[h] = None

    def insert(self, hashes: list[int]) -> int:
        """Computed pages enter the tree locked by their request; returns how many were new.

        A page already there (computed twice, e.g. by two requests in one batch) is locked instead.
        """
        locks, stored = self.locks, self.stored
        new = 0
        for h in hashes:
            c = locks.get(h)
            if c is None:
                locks[h] = 1
                stored.append(h)
                new += 1
            else:
                if not c:
                    del self.lru[h]
                locks[h] = c + 1
        return new

    def finish(self, hashes: list[int], inserted: int, full: int) -> None:
        """A request ends: ``insert`` its computed pages ``hashes[inserted:full]``, then ``unlock`` ``hashes[:full]``
        (in one call, without slicing the whole chain: a finished request's pages cover its prompt)."""
        if full > inserted:
            self.insert(hashes[inserted:full])
        locks, lru = self.locks, self.lru
        for h in reversed(hashes) if full == len(hashes) else reversed(hashes[:full]):
            c = locks[h] - 1
            locks[h] = c
            if not c:
                lru[h] = None

    def reserve(self, pages: int) -> bool:
        """Room for ``pages`` more, evicting unlocked pages as needed; False if the locked ones fill it."""
        short = pages - (self.capacity - len(self.locks) - self.reserved)  # (``free``)
        if short > 0:
            if short > len(self.lru):
                return False
            locks, removed, pop = self.locks, self.removed, self.lru.popitem
            for _ in range(short):
                h = pop(False)[0]
                del locks[h]
                removed.append(h)
            self.evicted += short
        self.reserved += pages
        return True

    def take_events(self) -> tuple[list[int], list[int]]:
        """``(removed, stored)`` since the last call."""
        removed, stored = self.removed, self.stored
        self.removed, self.stored = [], []
        return removed, stored


def new_kv_cache(capacity_pages: int) -> KVCacheModel:
    """A worker's KV cache model of ``capacity_pages`` pages: the C one when it was built, else ``KVCacheModel``."""
    if native_kv_cache is not None:
        return native_kv_cache.KVPages(capacity_pages)
    return KVCacheModel(capacity_pages)
