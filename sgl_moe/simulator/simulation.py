"""One simulated run: a workload stream, a client, a router (or a model of sglang-router), N engines.

Clients:

* ``offline``: every request is sent at t=0; the project's router holds them in its FIFO queue
  (unbounded here) and admits them against Θ; sglang-router forwards them all to the workers at once.
* ``closed``: ``concurrency`` requests in flight; each answer sends the next request.
* ``open``: Poisson arrivals at ``rate`` per second; a request the router's full queue refuses is
  counted as rejected and not retried.

``admission=False`` runs the project's router with an infinite Θ (every request placed at once).
"""

from __future__ import annotations

import array
import gc
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from sgl_moe.router.config import RouterConfig
from sgl_moe.simulator.engine import Engine, SharedCompute
from sgl_moe.simulator.replica_frontends import OwnerPlacement, ReplicaFrontends
from sgl_moe.simulator.router_frontend import RouterFrontend
from sgl_moe.simulator.sglang_router_model import CacheAwareConfig, SglangRouterFrontend
from sgl_moe.simulator.timeline import Timeline
from sgl_moe.simulator.timing_model import Calibration, Transfer
from sgl_moe.simulator.units import SimUnit

ROUTER_POLICIES = ("longest_block_match", "round_robin", "least_flops")
SGLANG_ROUTER_POLICIES = ("cache_aware", "power_of_two")
POLICIES = ROUTER_POLICIES + SGLANG_ROUTER_POLICIES

Arrival = Literal["offline", "closed", "open"]
ReplicaPlacement = Literal["owner", "shared"]

EXPIRE_INTERVAL_S = 2.0
"""How often the router's health loop expires pending promises (its default health interval)."""


@dataclass(frozen=True)
class SimConfig:
    """One run's settings besides the stream and the calibration."""

    workers: int = 8
    """Simulated workers (one KV cache and one attention-DP rank each)."""
    policy: str = "longest_block_match"
    """One of ``POLICIES``: the router's own three or the two sglang-router models."""
    arrival: Arrival = "offline"
    """offline (all at t=0), closed (fixed concurrency) or open (Poisson rate)."""
    concurrency: int = 32
    """Requests in flight for ``closed``."""
    rate: float = 100.0
    """Requests per second for ``open``."""
    transfer: Transfer = "none"
    """Weight transfers every forward pass must hide: none, nvlink or pcie (calibration's times)."""
    theta_flops: float | None = None
    """Θ of every worker; default: the calibration's, else the knee of the worker's start-up throughput profile
    run on the calibration's timing model (``timing_model.profiled_theta``), as live workers measure it."""
    admission: bool = True
    """Θ admission in the project's router; False places every request at once (Θ infinite)."""
    queue_size: int | None = None
    """The router's queue bound for closed/open runs (default: the router's 4096; offline: unbounded)."""
    max_affinity_wait_s: float = 2.0
    """The router's --max-affinity-wait-s."""
    pending_ttl_s: float = 10.0
    """The router's --pending-ttl-s."""
    prefix_wait_s: float = RouterConfig.prefix_wait_s
    """The router's --prefix-wait-s and its default (0: never hold a request for promised blocks)."""
    event_delay_s: float | None = None
    """KV-event delay; default: the calibration's."""
    hold_spills: bool = False
    """The router's --hold-spills (on in the router by default): a job about to be held for promised blocks may
    spill to a worker with room instead. Off here by default (the memo cannot vouch for it: a run with it goes
    without the memo, slower); ``live_replay`` turns it on, as the live router ran."""
    request_overhead_flops: float = 0.0
    """FLOPs the router adds to every request's cost against Θ (a live worker's measured per-request overhead,
    the router's --request-overhead-flops); simulated workers measure none."""
    seed: int = 0
    """Seed of the client's randomness (open-loop arrivals) and of power_of_two."""
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)
    memo: bool = True
    """Skip re-scoring queued jobs whose answer cannot have changed (``memo``); same placements, faster."""
    replicas: int = 1
    """Router replicas in front of the same workers, requests spread round-robin (``replica_frontends``; the
    project's router policies only, the sglang-router models ignore it; closed or open arrivals; the memo is off
    with more than one, unless one owner places for all)."""
    replicas_share: bool = True
    """The replicas share through the broker (the router's ``--peers``); False: each runs alone."""
    replica_placement: ReplicaPlacement = "owner"
    """Sharing replicas: one owner places every replica's requests (``OwnerPlacement``; the router's default
    ``--replica-placement owner``), or each places its own on shared tables (``shared``: ``ReplicaFrontends``)."""
    replica_delay_s: float = 0.005
    """How long a replica's messages take to reach the others (through the broker)."""

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from {', '.join(POLICIES)}")
        if self.workers < 1 or self.concurrency < 1 or not self.rate > 0:
            raise ValueError("workers, concurrency and rate must be positive")
        if self.replica_placement not in ("owner", "shared"):
            raise ValueError(f"unknown replica_placement {self.replica_placement!r}; choose owner or shared")
        if self.replicas < 1 or self.replica_delay_s < 0:
            raise ValueError("replicas must be positive and replica_delay_s not negative")
        if self.replicas > 1 and self.arrival == "offline":
            raise ValueError("replicas > 1 needs closed or open arrivals (offline runs fill one router's queue)")


@dataclass
class SimResult:
    """What one run measured; ``to_dict`` is the JSON row."""

    policy: str
    workers: int
    units: int = 0
    tasks: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    predicted_cached_tokens: int | None = None
    """The project's router: cached tokens it predicted when it placed each request (its own metric of that
    name); None for the sglang-router models."""
    computed_tokens: int = 0
    oracle_cached_tokens: int = 0
    rejected: int = 0
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    steps: int = 0
    transfer_bound_steps: int = 0
    mean_step_tokens: float = 0.0
    busy_fraction: float = 0.0
    max_load_before_admission: float | None = None
    spills: int | None = None
    decision_p50_us: float | None = None
    units_per_worker: tuple[int, int] = (0, 0)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput_rps(self) -> float:
        return self.units / self.sim_seconds if self.sim_seconds else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.sim_seconds if self.sim_seconds else 0.0

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def oracle_fraction(self) -> float:
        return self.oracle_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "extra"}
        out.update(throughput_rps=self.throughput_rps, prompt_tokens_per_s=self.prompt_tokens_per_s,
                   cached_fraction=self.cached_fraction, oracle_fraction=self.oracle_fraction, **self.extra)
        return out


class Simulation:
    """Wires the pieces of one run and runs the timeline to the last answer."""

    def __init__(self, cfg: SimConfig, cal: Calibration, units: Iterable[SimUnit]) -> None:
        cfg.validate()
        self.cfg = cfg
        self.cal = cal
        self.units = units
        self.timeline = Timeline()
        shared = SharedCompute(cal.shared_compute)
        transfer = cal.transfer_s(cfg.transfer)
        self.engines = [Engine(f"w{i}", cal, transfer, self.timeline, self, shared) for i in range(cfg.workers)]
        self.theta = cfg.theta_flops if cfg.theta_flops is not None else cal.theta_for(transfer)
        if cfg.policy in ROUTER_POLICIES:
            unbounded = cfg.arrival == "offline"
            owner_mode = cfg.replicas > 1 and cfg.replicas_share and cfg.replica_placement == "owner"

            def router() -> RouterFrontend:
                return RouterFrontend(
                    cfg.policy, cal, self.theta if cfg.admission else float("inf"), self.engines, self.timeline,
                    queue_size=2**62 if unbounded else (cfg.queue_size or 4096),
                    max_affinity_wait_s=cfg.max_affinity_wait_s, pending_ttl_s=cfg.pending_ttl_s,
                    prefix_wait_s=cfg.prefix_wait_s,
                    event_delay_s=cal.event_delay_s if cfg.event_delay_s is None else cfg.event_delay_s,
                    # one scheduler places everything (one router, or the owner): nothing changes its tables behind
                    # the memo's back, as the shared replicas' peer tables do
                    memo=cfg.memo and (cfg.replicas == 1 or owner_mode),
                    request_overhead_flops=cfg.request_overhead_flops, hold_spills=cfg.hold_spills)

            self.frontend: RouterFrontend | ReplicaFrontends | OwnerPlacement | SglangRouterFrontend
            if cfg.replicas == 1:
                self.frontend = router()
            elif owner_mode:
                self.frontend = OwnerPlacement(cfg.replicas, cfg.replica_delay_s, router(), self.timeline)
                self.frontend.on_refused = self._refused_late
            else:
                self.frontend = ReplicaFrontends(
                    cfg.replicas, cfg.replica_delay_s if cfg.replicas_share else None, router, self.timeline)
        else:
            self.frontend = SglangRouterFrontend(cfg.policy, self.engines, cfg.seed, cfg.cache_aware)
        self.result = SimResult(cfg.policy, cfg.workers)
        self._latencies = array.array("d")
        self._stream: Iterator[SimUnit] = iter(())
        self._outstanding = 0
        self._submitted = 0
        self._last_finish = 0.0
        self._rng = random.Random(cfg.seed)

    # -- EngineSink --------------------------------------------------------------------------
    def finished(self, units: list[SimUnit]) -> None:
        r = self.result
        for unit in units:
            r.units += 1
            r.prompt_tokens += unit.tokens
            r.cached_tokens += unit.cached
            if unit.placement is not None:
                r.predicted_cached_tokens = (r.predicted_cached_tokens or 0) + unit.placement.predicted_cached_tokens
            self._latencies.append(unit.finished - unit.arrival)
            self._outstanding -= 1
            self._last_finish = unit.finished
        self.frontend.finished(units)
        closed = self.cfg.arrival == "closed"
        for unit in units:
            unit.hashes = unit.segments = None  # type: ignore[assignment]  # done with: free the memory
            if closed:
                self._send_next()

    def kv_events(self, engine: Engine, removed: list[int], stored: list[int]) -> None:
        self.frontend.kv_events(engine, removed, stored)

    # -- client ------------------------------------------------------------------------------
    def _send(self, unit: SimUnit) -> None:
        unit.arrival = self.timeline.now
        self._submitted += 1
        if self.frontend.submit(unit):
            self._outstanding += 1
            return
        self._rejected(unit)

    def _refused_late(self, unit: SimUnit) -> None:
        """A request accepted at first and refused later (the placement owner's full queue: ``OwnerPlacement``)."""
        self._outstanding -= 1
        self._rejected(unit)

    def _rejected(self, unit: SimUnit) -> None:
        self.result.rejected += 1
        if self.cfg.arrival == "closed":  # the client keeps its slot and retries after Retry-After (>= 1 s)
            self._outstanding += 1
            self.timeline.at(self.timeline.now + 1.0, self._retry, unit)

    def _retry(self, unit: SimUnit) -> None:
        self._outstanding -= 1
        self._send(unit)

    def _send_next(self, _: object = None) -> None:
        unit = next(self._stream, None)
        if unit is not None:
            self._send(unit)

    def _arrive(self, _: object = None) -> None:
        unit = next(self._stream, None)
        if unit is None:
            return
        self._send(unit)
        self.timeline.at(self.timeline.now + self._rng.expovariate(self.cfg.rate), self._arrive)

    def _expire(self, _: object = None) -> None:
        self.frontend.expire_promises()
        if len(self.timeline):  # anything else still to happen
            self.timeline.at(self.timeline.now + EXPIRE_INTERVAL_S, self._expire)

    def _counting(self, units: Iterator[SimUnit]) -> Iterator[SimUnit]:
        """Offline units as the router's queue takes them in (all arrived at t=0)."""
        for unit in units:
            self._submitted += 1
            self._outstanding += 1
            yield unit

    # -- run ---------------------------------------------------------------------------------
    def run(self) -> SimResult:
        cfg = self.cfg
        wall0, cpu0 = time.perf_counter(), time.process_time()
        gc_was = gc.isenabled()
        gc.disable()  # millions of long-lived ints and few cycles: collections would rescan them all
        try:
            self._stream = iter(self.units)
            if cfg.arrival == "offline":
                if isinstance(self.frontend, RouterFrontend):
                    self.frontend.submit_offline(self._counting(self._stream))
                else:
                    for unit in self._stream:
                        self._send(unit)
            elif cfg.arrival == "closed":
                for _ in range(cfg.concurrency):
                    self._send_next()
            else:
                self._arrive()
            if isinstance(self.frontend, (RouterFrontend, ReplicaFrontends, OwnerPlacement)):
                self.timeline.at(EXPIRE_INTERVAL_S, self._expire)
            self.timeline.run()
        finally:
            if gc_was:
                gc.enable()
        if self._outstanding:
            raise RuntimeError(f"simulation stalled with {self._outstanding} requests unanswered")
        return self._summarise(time.perf_counter() - wall0, time.process_time() - cpu0)

    def _summarise(self, wall: float, cpu: float) -> SimResult:
        r = self.result
        r.wall_seconds, r.cpu_seconds = wall, cpu
        r.computed_tokens = r.prompt_tokens - r.cached_tokens
        r.sim_seconds = self._last_finish
        lat = sorted(self._latencies)
        if lat:
            r.latency_p50_s = lat[len(lat) // 2]
            r.latency_p99_s = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        stats = [e.stats for e in self.engines]
        r.steps = sum(s.steps for s in stats)
        r.transfer_bound_steps = sum(s.transfer_bound_steps for s in stats)
        r.mean_step_tokens = sum(s.computed_tokens for s in stats) / r.steps if r.steps else 0.0
        r.busy_fraction = sum(s.busy_s for s in stats) / (len(stats) * r.sim_seconds) if r.sim_seconds else 0.0
        per_worker = [s.units for s in stats]
        r.units_per_worker = (min(per_worker), max(per_worker))
        r.tasks = getattr(self.units, "tasks", 0)
        r.oracle_cached_tokens = getattr(self.units, "oracle_cached", 0)
        f = self.frontend
        if isinstance(f, RouterFrontend):
            r.max_load_before_admission = f.max_inflight_before / self.theta
            r.spills = f.scheduler.stats.spills
            times = sorted(f.scheduler.decision_times())
            r.decision_p50_us = times[len(times) // 2] * 1e6 if times else None
            r.extra["theta_flops"] = f.theta
        elif isinstance(f, ReplicaFrontends):
            r.max_load_before_admission = f.max_true_before / self.theta  # every replica's own load summed
            r.spills = sum(x.scheduler.stats.spills for x in f.replicas)
            times = sorted(t for x in f.replicas for t in x.scheduler.decision_times())
            r.decision_p50_us = times[len(times) // 2] * 1e6 if times else None
            r.extra["theta_flops"] = f.theta
            r.extra["replicas"] = len(f.replicas)
            r.extra["replicas_share"] = f.delay_s is not None
            r.extra["replica_placement"] = "shared" if f.delay_s is not None else "alone"
            r.extra["replica_delay_s"] = f.delay_s
            r.extra["peer_messages"] = f.messages
            r.extra["max_true_load_past_theta_flops"] = max(0.0, f.max_true_before - self.theta)
        elif isinstance(f, OwnerPlacement):
            o = f.owner
            r.max_load_before_admission = f.max_true_before / self.theta  # the owner's count is every request's
            r.spills = o.scheduler.stats.spills
            times = sorted(o.scheduler.decision_times())
            r.decision_p50_us = times[len(times) // 2] * 1e6 if times else None
            r.extra["theta_flops"] = f.theta
            r.extra["replicas"] = f.count
            r.extra["replicas_share"] = True
            r.extra["replica_placement"] = "owner"
            r.extra["replica_delay_s"] = f.delay_s
            r.extra["peer_messages"] = f.messages
            r.extra["remote_placed"] = f.remote
            r.extra["refused_late"] = f.refused_late
            r.extra["max_true_load_past_theta_flops"] = max(0.0, f.max_true_before - self.theta)
        else:
            r.extra["decisions"] = dict(f.decisions)
        r.extra["evicted_pages"] = sum(e.cache.evicted for e in self.engines)
        r.extra["overcommits"] = sum(s.overcommits for s in stats)
        r.extra["events_run"] = self.timeline.events_run
        return r
