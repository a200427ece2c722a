"""Requests that were running on a worker when it died: suspects until a run alone tells, then innocent or poison.

A worker process that dies while it runs a request may have been killed by that request (an input the
router's checks did not foresee crashes SGLang's scheduler, and SGLang then takes the whole server down), or
by something else (out of memory, a reboot). The router cannot tell which of the requests in flight did it, so
all of them become suspects, remembered by fingerprint (route and forwarded body, without any ``rid``). Each is
retried alone on a healthy worker, one at a time (``quarantine``): a suspect whose run alone ends with the
worker answering is innocent and forgotten; one whose run alone kills that worker too is poison, and the same
request is refused with 400 for ``--suspect-ttl-s``. A death is *explained* — and its requests retried as any
failure — when the connection was refused before anything was sent, or when the worker still answers
afterwards (a dropped connection, not a death).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Suspect:
    rid: str
    worker_id: str
    """The worker that died running it (for poison: the second one, which ran it alone)."""
    at: float
    """``time.monotonic()`` of that death: the entry expires ``ttl_s`` after it."""
    poison: bool = False
    """Its run alone killed a second worker: refused until it expires."""
    first_worker_id: str | None = None
    """For poison: the worker it was running on when it first became a suspect."""


class SuspectList:
    """Fingerprints of suspect and poison requests, oldest first; bounded in size and age."""

    def __init__(self, ttl_s: float, capacity: int = 65536) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._items: OrderedDict[bytes, Suspect] = OrderedDict()
        self.refused = 0
        """Requests refused because they were poison."""
        self.cleared = 0
        """Suspects whose run alone ended with the worker alive (innocent)."""
        self.convicted = 0
        """Suspects whose run alone killed the worker too (poison)."""

    @staticmethod
    def fingerprint(endpoint: str, body: bytes) -> bytes:
        """16 bytes naming a request's body: SHA-256, which OpenSSL runs on the CPU's SHA instructions where it has
        them (2x blake2b's speed on the 2-core VM: 7 vs 14 us for a 10 kB body)."""
        h = hashlib.sha256(endpoint.encode())
        h.update(b"\0")
        h.update(body)
        return h.digest()[:16]

    def add(self, key: bytes, suspect: Suspect) -> None:
        """``key`` was running on a worker that died (poison stays poison)."""
        known = self._items.get(key)
        if known is not None and known.poison and not suspect.poison:
            return
        self._items[key] = suspect
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def convict(self, key: bytes, rid: str, worker_id: str, now: float | None = None) -> Suspect:
        """``key`` ran alone on ``worker_id`` and that worker died: poison from now for ``ttl_s``."""
        known = self._items.get(key)
        poison = Suspect(rid, worker_id, time.monotonic() if now is None else now, poison=True,
                         first_worker_id=known.worker_id if known is not None else None)
        self.convicted += 1
        self.add(key, poison)
        return poison

    def clear(self, key: bytes) -> None:
        """``key`` ran alone and its worker lived: innocent."""
        known = self._items.get(key)
        if known is not None and not known.poison:
            del self._items[key]
            self.cleared += 1

    def find(self, key: bytes, now: float | None = None) -> Suspect | None:
        now = time.monotonic() if now is None else now
        while self._items:  # expire from the oldest end
            oldest_key, oldest = next(iter(self._items.items()))
            if now - oldest.at < self.ttl_s:
                break
            del self._items[oldest_key]
        return self._items.get(key)

    def __len__(self) -> int:
        return len(self._items)
