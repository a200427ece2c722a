"""Where each prefix last went: the worker a matching-nothing request is sent to, so prefixes keep a home.

With KV pools smaller than the set of live prefixes, a prefix is soon evicted everywhere. Placed by load
alone, its next request lands wherever room is, and over a stream every worker ends up serving every
prefix: each pool then holds a third (at three workers) of what it could reuse. Remembering the worker a
prefix was last placed on and sending the next request that matches nothing anywhere back there keeps each
worker's share of the prefixes, and so its pool, small (sglang-router's ``cache_aware`` gets the same effect
from a tree of past routes that KV-cache evictions never prune).

The map holds block hashes (hash chains: one hash stands for its whole prefix) at positions 0, 1, 3, 7, ...
(2^k - 1) and the last block of each placed prompt, so recording and looking up cost O(log blocks); it keeps
the ``capacity`` most recently recorded hashes. A home that is no longer a routable worker is ignored.

On by default (``RouterConfig.prefix_homes``): on the CPU policy matrix with bounded pools it raised reuse where
requests queue in the router (open 95%: cached 0.55 -> 0.69 against cache_aware's 0.66 / 0.69 in paired runs on a
quiet host) and left throughput within the runs' spread.

``PrefixHomes`` is the C type ``native_prefix_homes.PrefixHomes`` (``native_prefix_homes.c``, built at install) where
it was built, else ``PrefixHomesPy``, its reference: the same answers, the same hashes kept and dropped in the same
order (``tests/router/test_prefix_homes.py``). ``NATIVE`` says which one runs. The C type takes signed 64-bit hashes
(the router's page hashes are).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache

try:
    from sgl_moe.router.placement import native_prefix_homes
except ImportError:  # no C compiler at install: the Python map below
    native_prefix_homes = None


@lru_cache(maxsize=8192)
def sampled_positions(n: int) -> tuple[int, ...]:
    """Block positions recorded for a prompt of ``n`` blocks, deepest first (cached: every placement asks)."""
    if n <= 0:
        return ()
    out = [n - 1]
    p = 1
    while p - 1 < n - 1:
        out.append(p - 1)
        p *= 2
    return tuple(sorted(set(out), reverse=True))


class PrefixHomesPy:
    """Block hash -> id of the worker the last request holding that prefix was placed on (bounded, LRU)."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._home: OrderedDict[int, str] = OrderedDict()
        """Oldest recorded first (an ordered dict: dropping the oldest is O(1); a plain dict's iteration would
        walk the holes its deletions leave at the front, quadratic once the map is full)."""

    def __len__(self) -> int:
        return len(self._home)

    def record(self, keys: Sequence[int], worker_id: str) -> None:
        """A request with block hashes ``keys`` was placed on ``worker_id``."""
        home = self._home
        for p in sampled_positions(len(keys)):
            k = keys[p]
            if k in home:
                home.move_to_end(k)  # the most recently recorded survive
            home[k] = worker_id
        pop = home.popitem
        for _ in range(len(home) - self.capacity):
            pop(last=False)

    def home(self, keys: Sequence[int]) -> str | None:
        """The worker the longest recorded prefix of ``keys`` was last placed on, or None."""
        home = self._home
        for p in sampled_positions(len(keys)):
            w = home.get(keys[p])
            if w is not None:
                return w
        return None

    def items(self) -> list[tuple[int, str]]:
        """``[(hash, worker id)]``, least recently recorded first."""
        return list(self._home.items())


NATIVE = native_prefix_homes is not None
PrefixHomes = native_prefix_homes.PrefixHomes if NATIVE else PrefixHomesPy
