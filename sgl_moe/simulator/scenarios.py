"""The scenario matrix of issue 18 in the simulator: the workload shapes a prefill-only user runs.

A scenario is a stream, a KV-pool regime and an arrival process, run at each worker count by every policy
on the same units (the simulator's counterpart of ``policy_bench``'s matrix, scaled to 8-256 workers):

* **stream**: shared prefixes (``prefix_units``) with Zipf or uniform group popularity, or the Table-2 mix
  (``sgl_moe.workloads``);
* **pool**: ``bounded``: each worker's KV pool is ``Sizes.pool_tokens`` and the distinct prefixes fill
  three such pools, so one worker cannot hold them and placement decides the reuse (the Table-2 mix gets
  the same pool); ``unbounded``: pools never evict;
* **arrival**: ``closed`` (a few clients per worker, each sends its next request when answered), ``open``
  (Poisson at a fraction of the capacity, the best req/s of the bulk scenario of the same stream and pool,
  so the bulk scenario runs first), ``bulk`` (everything offered at t=0: a deep backlog).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Arrival = Literal["closed", "open", "bulk"]
StreamKind = Literal["zipf", "uniform", "mix"]
Pool = Literal["bounded", "unbounded"]


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is (the full matrix and the smoke run differ only here)."""

    requests_per_worker: int = 100
    """Requests of a scenario per worker (the mix: workload tasks per worker) ..."""
    min_requests: int = 3000
    """... and at least this many."""
    prefix_tokens: int = 2048
    suffix_tokens: int = 256
    prefix_pools: float = 3.0
    """Distinct prefixes, in KV pools of one worker (``bounded``)."""
    clients_per_worker: float = 1.5
    """Closed loop: requests in flight per worker ("a few clients")."""
    mix_length_scale: float = 8.0
    """Table-2 mix: divide context lengths by this (the simulator's default)."""
    pool_tokens: int | None = 36864
    """A bounded worker's KV pool (room for 18 prefixes: the distinct prefixes fill 3 pools, so a worker
    shown every prefix evicts, while the prefixes split over the workers fit); None: the calibration's."""

    def requests(self, workers: int) -> int:
        return max(self.min_requests, self.requests_per_worker * workers)

    def groups(self, pool_tokens: int) -> int:
        return max(2, round(self.prefix_pools * pool_tokens / self.prefix_tokens))

    def clients(self, workers: int) -> int:
        return max(1, round(self.clients_per_worker * workers))


FULL = Sizes()
SMOKE = Sizes(requests_per_worker=40, min_requests=120, prefix_tokens=256, suffix_tokens=32, pool_tokens=4096)
"""Seconds-long: CI's smoke run of the matrix."""


@dataclass(frozen=True)
class Scenario:
    name: str
    stream: StreamKind
    pool: Pool
    arrival: Arrival
    load: float = 0.0
    """Open loop: offered rate as a fraction of the capacity (best req/s of ``capacity_from``)."""

    @property
    def capacity_from(self) -> str:
        """Open loop: the bulk scenario of the same stream and pool."""
        return f"bulk-{self.stream}-{self.pool}"

    def describe(self) -> str:
        what = {"zipf": "Zipf-popular shared prefixes", "uniform": "uniformly popular shared prefixes",
                "mix": "Table-2 mix"}[self.stream]
        how = {"closed": "closed loop, few clients", "bulk": "offline bulk (all offered at once)",
               "open": f"open loop, Poisson at {self.load:.0%} of capacity"}[self.arrival]
        return f"{what}, KV pools {self.pool}, {how}"


def _family(stream: StreamKind, pool: Pool) -> list[Scenario]:
    tail = f"{stream}-{pool}"
    return [Scenario(f"bulk-{tail}", stream, pool, "bulk"), Scenario(f"closed-{tail}", stream, pool, "closed")] + [
        Scenario(f"open{round(load * 100)}-{tail}", stream, pool, "open", load) for load in (0.50, 0.80, 0.95)]


MATRIX: tuple[Scenario, ...] = tuple(
    s for stream, pool in (("zipf", "bounded"), ("uniform", "bounded"), ("zipf", "unbounded"),
                           ("uniform", "unbounded"), ("mix", "bounded")) for s in _family(stream, pool))
"""In run order: a bulk scenario runs before the open-loop scenarios that take their capacity from it."""


def select(names: str | None) -> tuple[Scenario, ...]:
    """The scenarios named (comma-separated), in matrix order, with the bulk runs open-loop ones need."""
    if not names:
        return MATRIX
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    known = {s.name for s in MATRIX}
    unknown = sorted(wanted - known)
    if unknown or not wanted:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(s.name for s in MATRIX)}")
    needed = wanted | {s.capacity_from for s in MATRIX if s.name in wanted and s.arrival == "open"}
    return tuple(s for s in MATRIX if s.name in needed)
