"""Requests that were running on a worker when it died: never offered to a second worker.

A worker process that dies while it runs a request may have been killed by that request (an input the
router's checks did not foresee crashes SGLang's scheduler, and SGLang then takes the whole server down).
The router cannot tell which of the requests in flight did it, so it treats all of them as suspects: none
is retried elsewhere, and the same request (same route, same forwarded body) arriving again within
``--suspect-ttl-s`` is refused with 400 instead of being placed. A death is *explained* — and its requests
are retried as before — when the worker was already out of rotation, when the connection was refused before
anything was sent, or when the worker still answers with the same instance id afterwards (a dropped
connection, not a death).
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
    at: float
    """``time.monotonic()`` of the death."""


class SuspectList:
    """Fingerprints of suspect requests, oldest first; bounded in size and age."""

    def __init__(self, ttl_s: float, capacity: int = 65536) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._items: OrderedDict[bytes, Suspect] = OrderedDict()
        self.refused = 0
        """Requests refused because they were suspects."""

    @staticmethod
    def fingerprint(endpoint: str, body: bytes) -> bytes:
        return hashlib.blake2b(endpoint.encode() + b"\0" + body, digest_size=16).digest()

    def add(self, key: bytes, suspect: Suspect) -> None:
        self._items[key] = suspect
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

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
