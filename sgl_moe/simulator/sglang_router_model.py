"""Models of sglang-router's ``cache_aware`` and ``power_of_two`` policies (HTTP mode, no KV events).

These are models, not the Rust code. sglang-router forwards every request at once (no admission,
no queue of its own) and counts the requests in flight per worker. ``cache_aware``:

1. The load is imbalanced when ``max - min > balance_abs`` and ``max > balance_rel x min`` (in-flight
   requests): the request goes to the least-loaded worker.
2. Otherwise its approximate tree (what the router itself routed, never what the workers hold) gives
   the longest prefix routed before and a worker it went to. If that prefix is more than
   ``cache_threshold`` of the request, the request follows it; else it goes to the worker whose tree
   is smallest (sglang-router's rule; "least loaded" would be the same when the trees grow evenly).
3. The request is inserted into the tree under the chosen worker.

The Rust tree holds characters; here it holds the segments of each request's context (equal keys =
equal text, see ``sgl_moe.workloads``), so a match stops at the first different segment instead of
the first different character (a few characters later in the real tree). What follows the context
(a choice listing, a candidate) is never shared by another request, so it only adds to the tree's
size. Of the workers at the deepest matched node, the one that reached it last is taken. The tree's
periodic LRU eviction is not modelled.

``power_of_two`` picks two distinct workers at random and sends the request to the one with fewer
requests in flight.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sgl_moe.simulator.engine import Engine
from sgl_moe.simulator.units import SimUnit


@dataclass(frozen=True)
class CacheAwareConfig:
    cache_threshold: float = 0.3
    """Minimum routed-prefix fraction of a request for it to follow that prefix."""
    balance_abs: int = 64
    """Imbalance needs max - min in-flight requests above this ..."""
    balance_rel: float = 1.5
    """... and max above this times min."""


class SglangRouterFrontend:
    """Sends each unit straight to an engine, chosen by one of the two modelled policies."""

    def __init__(self, policy: str, engines: list[Engine], seed: int,
                 cfg: CacheAwareConfig = CacheAwareConfig()) -> None:
        if policy not in ("cache_aware", "power_of_two"):
            raise ValueError(f"not an sglang-router policy model: {policy}")
        self.policy = policy
        self.engines = engines
        self.cfg = cfg
        self.load = [0] * len(engines)
        """Requests in flight per worker, as sglang-router counts them."""
        self.tree_tokens = [0] * len(engines)
        self._index = {e.id: i for i, e in enumerate(engines)}
        # The tree, flat: (parent node, segment key) -> node; per node its tokens, the workers that
        # reached it (a bitmask) and the last one. Node 0 is the root.
        self._child: dict[tuple[int, str], int] = {}
        self._tokens = [0]
        self._tenants = [0]
        self._last = [-1]
        self._rng = random.Random(seed)
        self.rejected = 0
        self.decisions = {"imbalanced": 0, "prefix": 0, "smallest_tree": 0}

    def submit(self, unit: SimUnit) -> bool:
        i = self._cache_aware(unit) if self.policy == "cache_aware" else self._power_of_two()
        self.load[i] += 1
        self.engines[i].submit(unit)
        return True

    def finished(self, units: list[SimUnit]) -> None:
        for unit in units:
            self.load[self._index[unit.engine.id]] -= 1

    def kv_events(self, engine: Engine, removed: list[int], stored: list[int]) -> None:
        pass  # HTTP mode: sglang-router never sees the workers' caches

    def _power_of_two(self) -> int:
        if len(self.engines) == 1:
            return 0
        a, b = self._rng.sample(range(len(self.engines)), 2)
        return a if self.load[a] <= self.load[b] else b

    def _cache_aware(self, unit: SimUnit) -> int:
        cfg, load = self.cfg, self.load
        hi, lo = max(load), min(load)
        if hi - lo > cfg.balance_abs and hi > cfg.balance_rel * lo:
            choice = load.index(lo)
            self.decisions["imbalanced"] += 1
        else:
            node, matched = 0, 0
            child, tenants = self._child, self._tenants
            for seg in unit.segments[:unit.context]:
                nxt = child.get((node, seg.key))
                if nxt is None or not tenants[nxt]:
                    break
                node, matched = nxt, matched + seg.tokens
            if node and matched / unit.tokens > cfg.cache_threshold:
                choice = self._last[node]
                self.decisions["prefix"] += 1
            else:
                sizes = self.tree_tokens
                choice = sizes.index(min(sizes))
                self.decisions["smallest_tree"] += 1
        self._insert(unit, choice)
        return choice

    def _insert(self, unit: SimUnit, worker: int) -> None:
        bit = 1 << worker
        node = 0
        grown = unit.tokens
        child, tokens, tenants, last = self._child, self._tokens, self._tenants, self._last
        for seg in unit.segments[:unit.context]:
            nxt = child.get((node, seg.key))
            if nxt is None:
                nxt = child[(node, seg.key)] = len(tokens)
                tokens.append(seg.tokens)
                tenants.append(0)
                last.append(worker)
            if tenants[nxt] & bit:
                grown -= seg.tokens  # already in this worker's tree
            tenants[nxt] |= bit
            last[nxt] = worker
            node = nxt
        self.tree_tokens[worker] += grown
