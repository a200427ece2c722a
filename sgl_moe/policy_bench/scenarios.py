"""The scenario matrix of issue 18: the workload shapes a prefill-only user runs, each run by every router.

A scenario is a request stream (shared prefixes with Zipf or uniform popularity, or the Table-2 mix), an
arrival process (closed loop with a few clients, open loop with Poisson arrivals at a fraction of the
measured capacity, or offline bulk: everything offered at once) and a KV-pool regime. Workers are started
once with one KV pool size (``Sizes.pool_tokens``, SGLang's ``--max-total-tokens``); "bounded" means the
stream's prefix set is ~3 pools, so one worker cannot hold it and placement decides the reuse;
"unbounded" means the prefix set fits in half a pool, so any worker can hold every prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from sgl_moe.policy_bench.prefix_stream import PrefixStreamConfig

Arrival = Literal["closed", "open", "bulk"]
StreamKind = Literal["zipf", "uniform", "mix"]
Pool = Literal["bounded", "unbounded"]


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is (the real run and the smoke run differ only here)."""

    pool_tokens: int = 3072
    """Each worker's KV pool (``--max-total-tokens``)."""
    prefix_tokens: int = 256
    suffix_tokens: int = 32
    requests: int = 120
    """Requests of a closed-loop or bulk scenario."""
    open_seconds: float = 20.0
    """Open loop: requests = rate x this."""
    mix_tasks: int = 80
    """Table-2 mix: workload tasks (multi-selection tasks expand into several requests)."""
    mix_length_scale: float = 8.0
    clients: int = 4
    """Closed loop: requests in flight ("few clients")."""
    mix_clients: int = 32

    def groups(self, pool: Pool) -> int:
        prefix_set = 3 * self.pool_tokens if pool == "bounded" else self.pool_tokens // 2
        return max(2, prefix_set // self.prefix_tokens)


SMOKE = Sizes(pool_tokens=1024, prefix_tokens=64, suffix_tokens=16, requests=24, open_seconds=1.5, mix_tasks=12,
              clients=3, mix_clients=8)


@dataclass(frozen=True)
class Scenario:
    name: str
    stream: StreamKind
    pool: Pool
    arrival: Arrival
    load: float = 0.0
    """Open loop: offered rate as a fraction of the capacity measured in ``capacity_from``."""
    capacity_from: str = ""
    """Open loop: the bulk scenario of the same stream whose best req/s is the capacity."""

    def describe(self) -> str:
        what = {"zipf": "Zipf-popular shared prefixes", "uniform": "uniformly popular shared prefixes",
                "mix": "Table-2 mix"}[self.stream]
        how = {"closed": "closed loop", "bulk": "offline bulk (all offered at once)",
               "open": f"open loop, Poisson at {self.load:.0%} of capacity"}[self.arrival]
        return f"{what}, KV pools {self.pool}, {how}"

    def prefix_stream(self, sizes: Sizes, seed: int, requests: int | None = None) -> PrefixStreamConfig:
        assert self.stream != "mix"
        return PrefixStreamConfig(requests=requests or sizes.requests, groups=sizes.groups(self.pool),
                                  prefix_tokens=sizes.prefix_tokens, suffix_tokens=sizes.suffix_tokens,
                                  popularity=self.stream, seed=seed)


MATRIX: tuple[Scenario, ...] = (
    Scenario("bulk-zipf-bounded", "zipf", "bounded", "bulk"),
    Scenario("closed-zipf-bounded", "zipf", "bounded", "closed"),
    Scenario("open50-zipf-bounded", "zipf", "bounded", "open", 0.50, "bulk-zipf-bounded"),
    Scenario("open80-zipf-bounded", "zipf", "bounded", "open", 0.80, "bulk-zipf-bounded"),
    Scenario("open95-zipf-bounded", "zipf", "bounded", "open", 0.95, "bulk-zipf-bounded"),
    Scenario("closed-uniform-bounded", "uniform", "bounded", "closed"),
    Scenario("bulk-uniform-bounded", "uniform", "bounded", "bulk"),
    Scenario("closed-zipf-unbounded", "zipf", "unbounded", "closed"),
    Scenario("bulk-zipf-unbounded", "zipf", "unbounded", "bulk"),
    Scenario("closed-mix", "mix", "bounded", "closed"),
)
"""In run order: a bulk scenario runs before the open-loop scenarios that take their capacity from it."""


def select(names: str | None) -> tuple[Scenario, ...]:
    """The scenarios named (comma-separated), in matrix order; open-loop ones keep their capacity source."""
    if not names:
        return MATRIX
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {s.name for s in MATRIX}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    chosen = [s for s in MATRIX if s.name in wanted]
    sources = {s.capacity_from for s in chosen if s.arrival == "open"} - {s.name for s in chosen}
    return tuple(replace(s) for s in MATRIX if s.name in sources or s.name in wanted)
