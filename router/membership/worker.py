"""One worker as the router sees it: what it reported (``WorkerInfo``), its Θ, its load and its counters.

Θ comes from the worker's info unless the router's ``--saturation-flops`` pins it, and is installed in
one place, ``Worker.install``: when the worker joins, when a calibrated Θ arrives, and when it restarts (the
pool does each, ``WorkerPool.admit`` and ``WorkerPool.install``, and counts them).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from sgl_moe.flops import FlopsModel
from sgl_moe.router.membership.event_listener import EventListener
from sgl_moe.router.membership.tokenizer_probe import TokenizerCheck
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.wire import INFO_PATH, WorkerInfo

HEALTHY, UNHEALTHY = "healthy", "unhealthy"
STARTING = "starting"
"""Added while its start-up work (the Θ profile) ran: out of rotation until its ``/health`` answers 200."""
PINNED_THETA_SOURCE = "router flag --saturation-flops"


class WorkerError(Exception):
    """A worker cannot be added or removed; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, *, sglang: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.sglang = sglang
        """The URL answered as an SGLang worker (the message may then be shown to whoever added it)."""


class NotAWorker(WorkerError):
    """The URL did not answer as an SGLang worker (unreachable, or not SGLang). The message has network details
    for the log; ``POST /workers`` answers without them, so that it cannot be used to scan ports."""


@dataclass
class WorkerCounters:
    requests: int = 0
    failures: int = 0
    predicted_cached_tokens: int = 0
    """Sum over requests whose response reports cached tokens: what the router predicted."""
    reported_cached_tokens: int = 0
    """Sum over the same requests: what the worker reported (``meta_info.cached_tokens``)."""
    events_stored: int = 0
    events_removed: int = 0
    events_cleared: int = 0
    table_resets: int = 0
    restarts: int = 0


MIN_OBSERVED_REQUESTS = 4
"""Requests a worker must have finished before the router trusts the speed it observed there."""


@dataclass(eq=False)
class Worker:
    """A worker in the pool. Its in-flight FLOPs change only through the scheduler's reserve and release."""

    id: str
    url: str
    info: WorkerInfo
    """``GET /sgl_moe/info`` as last installed (see ``install``); for a plain SGLang worker, built by the router."""
    flops: FlopsModel
    theta: float
    theta_source: str
    slots: dict[int, int]
    """Attention-DP rank -> slot of its tables in the BlockIndex."""
    request_overhead_flops: float = 0.0
    """What one prompt costs here beyond its FLOPs, in FLOPs-equivalent (the worker's measured
    ``request_overhead_flops``; 0 when it did not measure one). Installed with Θ (``install``)."""
    reports_stored: bool = True
    """Blocks stored here reach the router as KV events, so a hold for blocks promised here ends when they are
    stored. False for a worker that publishes no KV events (``event_sink.attach``): the router never holds a
    request for its promised blocks, since nothing would say they were stored (each hold would last
    ``--prefix-wait-s``)."""
    state: str = HEALTHY
    inflight_flops: float = 0.0
    """FLOPs in flight here: this router's reservations plus ``peer_flops``."""
    peer_flops: float = 0.0
    """The other router replicas' in-flight FLOPs here, as they last published them (``--peers``; 0 alone)."""
    inflight_requests: int = 0
    peak_inflight_requests: int = 0
    health_failures: int = 0
    last_error: str | None = None
    last_progress: float = 0.0
    """``time.monotonic()`` of the worker's latest sign of work: an answer, or a batch of KV events. A health
    probe that times out while the worker keeps making progress means busy, not dead (``health``)."""
    completed_flops: float = 0.0
    """FLOPs of the requests that ended here (reservations released), with ``busy_seconds`` the speed seen."""
    completed_requests: int = 0
    busy_seconds: float = 0.0
    """Scheduler-clock seconds this worker had at least one request in flight, up to its last idle moment."""
    busy_since: float | None = None
    """Scheduler-clock time its current busy period began (None: idle)."""
    added_at: float = field(default_factory=time.time)
    counters: WorkerCounters = field(default_factory=WorkerCounters)
    listeners: list[EventListener] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)
    learned: dict[str, str] = field(default_factory=dict)
    """A plain SGLang worker (no ``/sgl_moe/info``): each field of ``info`` -> where the router learned it
    (``plain_worker``). Empty for an sgl_moe worker, which reports all of it itself."""
    tokenizer_check: TokenizerCheck | None = None
    """The router's ids against the worker's own when it joined (``tokenizer_probe``); None: not checked
    (a simulated worker)."""

    @classmethod
    def from_info(cls, worker_id: str, url: str, info: WorkerInfo, pinned_theta: float | None,
                  learned: dict[str, str] | None = None, pinned_overhead: float | None = None) -> Worker:
        """A worker that has just joined: no slots yet, Θ installed from ``info`` (or pinned)."""
        worker = cls(id=worker_id, url=url, info=info, flops=info.flops, theta=0.0, theta_source="", slots={},
                     learned=dict(learned or {}))
        worker.install(info, pinned_theta, pinned_overhead)
        return worker

    def install(self, info: WorkerInfo, pinned_theta: float | None, pinned_overhead: float | None = None) -> None:
        """Adopt the worker's latest info and its Θ (seed 000 App. B.4: installed on receipt), unless the
        router's ``--saturation-flops`` (``pinned_theta``) pins Θ for every worker. The request overhead is
        the worker's measurement unless ``--request-overhead-flops`` (``pinned_overhead``) pins it. A worker in a
        pool installs through ``WorkerPool.install``, which counts installs for the scheduler's load-ordered view."""
        self.info = info
        measured = info.saturation.request_overhead_flops or 0.0
        self.request_overhead_flops = measured if pinned_overhead is None else pinned_overhead
        if pinned_theta is not None:
            self.theta, self.theta_source = pinned_theta, PINNED_THETA_SOURCE
        else:
            origin = "router" if self.learned else "worker"  # a plain worker's Θ is the router's estimate
            self.theta, self.theta_source = info.saturation.flops, f"{origin}: {info.saturation.source}"

    def adopt_pooled(self, theta: float | None, source: str, overhead: float | None) -> bool:
        """Take the pooled calibration of this worker's kind (``calibration_pool``) over its own: Θ unless None or
        pinned by the router, the request overhead unless None. Whether Θ or the overhead changed."""
        before = (self.theta, self.request_overhead_flops)
        if theta is not None and self.theta_source != PINNED_THETA_SOURCE:
            self.theta = theta
            self.theta_source = f"{source}; its own: {self.info.saturation.source}"
        if overhead is not None:
            self.request_overhead_flops = overhead
        return (self.theta, self.request_overhead_flops) != before

    @property
    def cost_model(self) -> tuple[FlopsModel, float]:
        """What a job's cost here depends on besides the cached prefix: equal for two workers, equal costs."""
        return self.flops, self.request_overhead_flops

    @property
    def page_size(self) -> int:
        return self.info.page_size

    @property
    def instance_id(self) -> str | None:
        return self.info.instance_id

    def note_started(self, now: float) -> None:
        """A request is about to be counted in flight (before ``inflight_requests`` grows)."""
        if not self.inflight_requests:
            self.busy_since = now

    def note_finished(self, flops: float, now: float) -> None:
        """A request of ``flops`` ended (after ``inflight_requests`` shrank): its work counts toward the speed."""
        self.completed_flops += flops
        self.completed_requests += 1
        if not self.inflight_requests and self.busy_since is not None:
            self.busy_seconds += now - self.busy_since
            self.busy_since = None

    def observed_flops_per_s(self, now: float) -> float | None:
        """FLOPs this worker completed per second it was busy (the real workload's speed, batching included);
        None before ``MIN_OBSERVED_REQUESTS`` requests ended."""
        busy = self.busy_seconds + (now - self.busy_since if self.busy_since is not None else 0.0)
        if self.completed_requests < MIN_OBSERVED_REQUESTS or busy <= 0:
            return None
        return self.completed_flops / busy

    @property
    def profiled_flops_per_s(self) -> float | None:
        """The best FLOPs/s of the worker's start-up throughput profile (None: it did not profile)."""
        rates = self.info.saturation.throughput_flops_per_s
        return max(rates) if rates else None

    @property
    def admissible(self) -> bool:
        """In rotation and below Θ: may be given more work."""
        return self.state == HEALTHY and self.inflight_flops < self.theta

    def describe(self, index: BlockIndex) -> dict[str, Any]:
        committed = pending = 0
        for slot in self.slots.values():
            c, p = index.sizes(slot)
            committed, pending = committed + c, pending + p
        return {
            "id": self.id, "url": self.url, "state": self.state, "model": self.info.model_name,
            "model_path": self.info.model_path, "context_length": self.info.context_length,
            "page_size": self.page_size, "dp_size": len(self.slots),
            "learned": self.learned or {"info": f"the worker itself (GET {INFO_PATH})"},
            "committed_blocks": committed, "pending_blocks": pending,
            "inflight_flops": self.inflight_flops, "peer_inflight_flops": self.peer_flops,
            "theta_flops": self.theta, "theta_source": self.theta_source,
            "request_overhead_flops": self.request_overhead_flops,
            "inflight_requests": self.inflight_requests, "peak_inflight_requests": self.peak_inflight_requests,
            "completed_requests": self.completed_requests,
            "observed_flops_per_s": self.observed_flops_per_s(time.monotonic()),
            "profiled_flops_per_s": self.profiled_flops_per_s,
            "last_error": self.last_error,
            "tokenizer_check": self.tokenizer_check.describe() if self.tokenizer_check else None,
            "events": [{"dp_rank": lst.source.dp_rank, "endpoint": lst.source.endpoint,
                        "last_seq": lst.stats.last_seq, "gaps": lst.stats.gaps, "replays": lst.stats.replays,
                        "replay_failures": lst.stats.replay_failures, "resets": lst.stats.resets}
                       for lst in self.listeners],
            "counters": vars(self.counters),
        }
