"""The worker pool: discovery from ``GET /sgl_moe/info``, compatibility, health, and KV-event tables.

Each worker is learned from its URL alone: model, page size, context length, tokenizer, FLOPs
constants, saturation threshold Θ and KV-event endpoints (one per attention-DP rank). The pool owns
the event listeners and applies their batches to the committed tables in the ``BlockIndex``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from sgl_moe.flops import FlopsModel
from sgl_moe.router.block_index import BlockIndex
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.event_listener import EventListener, EventSource
from sgl_moe.router.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from sgl_moe.router.pending import PendingLedger
from sgl_moe.router.router_tokenizer import RouterTokenizer

log = logging.getLogger("sgl_moe.router.workers")

HEALTHY, UNHEALTHY = "healthy", "unhealthy"


class WorkerError(Exception):
    """A worker cannot be added or removed; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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


@dataclass(eq=False)
class Worker:
    id: str
    url: str
    info: dict[str, Any]
    flops: FlopsModel
    theta: float
    theta_source: str
    slots: dict[int, int]
    """Attention-DP rank -> slot of its tables in the BlockIndex."""
    state: str = HEALTHY
    inflight_flops: float = 0.0
    inflight_requests: int = 0
    peak_inflight_requests: int = 0
    health_failures: int = 0
    last_error: str | None = None
    added_at: float = field(default_factory=time.time)
    counters: WorkerCounters = field(default_factory=WorkerCounters)
    listeners: list[EventListener] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def page_size(self) -> int:
        return int(self.info["page_size"])

    @property
    def instance_id(self) -> str | None:
        return self.info.get("instance_id")

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
            "id": self.id, "url": self.url, "state": self.state, "model": self.info.get("model_name"),
            "page_size": self.page_size, "dp_size": len(self.slots),
            "committed_blocks": committed, "pending_blocks": pending,
            "inflight_flops": self.inflight_flops, "theta_flops": self.theta, "theta_source": self.theta_source,
            "inflight_requests": self.inflight_requests, "peak_inflight_requests": self.peak_inflight_requests,
            "last_error": self.last_error,
            "events": [{"dp_rank": lst.source.dp_rank, "endpoint": lst.source.endpoint,
                        "last_seq": lst.stats.last_seq, "gaps": lst.stats.gaps, "replays": lst.stats.replays,
                        "replay_failures": lst.stats.replay_failures, "resets": lst.stats.resets}
                       for lst in self.listeners],
            "counters": vars(self.counters),
        }


def _event_endpoint(endpoint: str, worker_url: str) -> str:
    """A wildcard bind address (``tcp://*:P``, ``tcp://0.0.0.0:P``) is reached on the worker's own host."""
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:"):
        if endpoint.startswith(wildcard):
            return f"tcp://{host}:{endpoint[len(wildcard):]}"
    return endpoint


class WorkerPool:
    """All workers the router knows; also the sink of their KV events."""

    def __init__(self, cfg: RouterConfig, index: BlockIndex, ledger: PendingLedger,
                 session: aiohttp.ClientSession, on_change) -> None:
        self.cfg = cfg
        self.index = index
        self.ledger = ledger
        self.session = session
        self.on_change = on_change
        """Called when capacity may have appeared (a worker added or back in rotation)."""
        self.workers: dict[str, Worker] = {}
        self.tokenizer: RouterTokenizer | None = None
        self._reference: dict[str, Any] | None = None
        self._next_id = 0
        self._slot_owner: dict[int, Worker] = {}
        self._adding: set[str] = set()

    # -- membership --------------------------------------------------------------------------
    @property
    def model_name(self) -> str | None:
        return self._reference["model_name"] if self._reference else None

    @property
    def context_length(self) -> int:
        return int(self._reference["context_length"]) if self._reference else 0

    @property
    def page_size(self) -> int:
        return int(self._reference["page_size"]) if self._reference else 0

    async def add(self, url: str) -> Worker:
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise WorkerError(400, f"worker URL must start with http:// or https://, got {url!r}")
        if url in self._adding or any(w.url == url for w in self.workers.values()):
            raise WorkerError(409, f"worker {url} is already registered")
        self._adding.add(url)
        try:
            info = await self._fetch_info(url)
            self._check_compatible(url, info)
            if self.tokenizer is None:
                self.tokenizer = await self._fetch_tokenizer(url, info)
            flops = FlopsModel.from_dict(info["flops"])
            if self.cfg.saturation_flops is not None:
                theta, source = self.cfg.saturation_flops, "router flag --saturation-flops"
            else:
                theta, source = float(info["saturation"]["flops"]), f"worker: {info['saturation']['source']}"
            worker = Worker(id=f"w{self._next_id}", url=url, info=info, flops=flops, theta=theta,
                            theta_source=source, slots={})
            self._next_id += 1
            if self._reference is None:
                self._reference = info
            endpoints = info.get("kv_events") or []
            ranks = [int(e["dp_rank"]) for e in endpoints] or list(range(max(1, int(info.get("dp_size") or 1))))
            for rank in ranks:
                slot = self.index.add_target()
                worker.slots[rank] = slot
                self._slot_owner[slot] = worker
            self.workers[worker.id] = worker
            for e in endpoints:
                events_source = EventSource(worker_id=worker.id, dp_rank=int(e["dp_rank"]),
                                     endpoint=_event_endpoint(e["endpoint"], url),
                                     replay_endpoint=_event_endpoint(e["replay_endpoint"], url)
                                     if e.get("replay_endpoint") else None, topic=e.get("topic") or "")
                listener = EventListener(events_source, self, drop_seqs=self.cfg.drop_seqs())
                worker.listeners.append(listener)
                worker.tasks.append(asyncio.create_task(listener.run(), name=f"events-{worker.id}-{events_source.dp_rank}"))
            if not endpoints:
                log.warning("worker %s (%s) publishes no KV events: its committed table stays empty and "
                            "routing to it relies on the pending table alone", worker.id, url)
            log.info("added worker %s at %s: model %s, page size %d, %d DP rank(s), Θ = %.3g FLOPs (%s)",
                     worker.id, url, info.get("model_name"), worker.page_size, len(worker.slots), theta, source)
        finally:
            self._adding.discard(url)
        self.on_change()
        return worker

    async def remove(self, worker_id: str) -> Worker:
        worker = self.workers.pop(worker_id, None)
        if worker is None:
            raise WorkerError(404, f"no worker with id {worker_id!r}; GET /workers lists them")
        for listener in worker.listeners:
            listener.stop()
        for task in worker.tasks:
            task.cancel()
        for slot in worker.slots.values():
            committed, pending = self.index.sizes(slot)
            self.index.remove_target(slot)
            self.ledger.forget_slot(slot)
            self._slot_owner.pop(slot, None)
            log.info("removed worker %s: purged %d committed and %d pending blocks", worker.id, committed, pending)
        worker.state = "removed"
        if not self.workers:
            self._reference = None
            self.tokenizer = None
        return worker

    async def close(self) -> None:
        for worker_id in list(self.workers):
            await self.remove(worker_id)

    def routable(self, exclude: frozenset[str] = frozenset()) -> list[Worker]:
        return [w for w in self.workers.values() if w.state == HEALTHY and w.id not in exclude]

    def any_healthy(self) -> bool:
        return any(w.state == HEALTHY for w in self.workers.values())

    def worker_of_slot(self, slot: int) -> Worker | None:
        return self._slot_owner.get(slot)

    # -- discovery ---------------------------------------------------------------------------
    async def _get(self, url: str, timeout: float = 10.0) -> aiohttp.ClientResponse:
        return await self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout))

    async def _fetch_info(self, url: str) -> dict[str, Any]:
        try:
            async with await self._get(f"{url}/sgl_moe/info") as resp:
                if resp.status == 404:
                    raise WorkerError(400, f"{url} is not an sgl_moe worker (GET /sgl_moe/info answered 404); "
                                           "start it with `python -m sgl_moe.launch_server`")
                if resp.status != 200:
                    raise WorkerError(502, f"{url}: GET /sgl_moe/info answered {resp.status}")
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise WorkerError(502, f"cannot reach worker {url}: {type(exc).__name__}: {exc}") from None

    def _check_compatible(self, url: str, info: dict[str, Any]) -> None:
        ref = self._reference
        for key in ("model_name", "page_size", "flops"):
            if key not in info:
                raise WorkerError(400, f"{url}: /sgl_moe/info lacks {key!r} (incompatible sgl_moe version?)")
        if ref is None:
            return
        if info["model_name"] != ref["model_name"] or info.get("model_path") != ref.get("model_path"):
            raise WorkerError(409, f"refusing {url}: it serves model {info['model_name']!r} "
                                   f"({info.get('model_path')}), the pool serves {ref['model_name']!r} "
                                   f"({ref.get('model_path')})")
        if info["page_size"] != ref["page_size"]:
            raise WorkerError(409, f"refusing {url}: page size {info['page_size']} differs from the pool's "
                                   f"{ref['page_size']}; block hashes would not match")

    async def _fetch_tokenizer(self, url: str, info: dict[str, Any]) -> RouterTokenizer:
        tok = info.get("tokenizer") or {}
        if not tok.get("tokenizer_json_url"):
            raise WorkerError(400, f"{url}: the worker's tokenizer has no tokenizer.json; the router needs it to "
                                   "hash prompts")
        try:
            async with await self._get(url + tok["tokenizer_json_url"], timeout=60) as resp:
                resp.raise_for_status()
                tokenizer_json = await resp.read()
            config = None
            if tok.get("tokenizer_config_url"):
                async with await self._get(url + tok["tokenizer_config_url"], timeout=60) as resp:
                    resp.raise_for_status()
                    config = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise WorkerError(502, f"cannot fetch the tokenizer from {url}: {exc}") from None
        return RouterTokenizer.from_files(tokenizer_json, config)

    # -- health ------------------------------------------------------------------------------
    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            await asyncio.gather(*(self.check(w) for w in list(self.workers.values())), return_exceptions=True)
            self.ledger.expire()

    async def check(self, worker: Worker) -> None:
        try:
            async with await self._get(f"{worker.url}/health", timeout=self.cfg.health_timeout_s) as r:
                ok = r.status == 200
                reason = f"GET /health answered {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            ok, reason = False, f"GET /health failed: {type(exc).__name__}"
        if worker.id not in self.workers:
            return
        if ok:
            worker.health_failures = 0
            if worker.state == UNHEALTHY:
                await self._readmit(worker)
            elif (worker.info.get("saturation") or {}).get("state") == "calibrating":
                await self._refresh_theta(worker)
            return
        worker.health_failures += 1
        worker.last_error = reason
        if worker.state == HEALTHY and worker.health_failures >= self.cfg.health_failures:
            self.mark_unhealthy(worker, reason)

    async def _refresh_theta(self, worker: Worker) -> None:
        """The worker was still calibrating Θ when added: re-read its info until the calibrated value arrives
        (seed 000 App. B.4: installed on receipt, unless the router's own --saturation-flops pins it)."""
        try:
            info = await self._fetch_info(worker.url)
        except WorkerError:
            return
        sat = info.get("saturation") or {}
        if info.get("instance_id") != worker.instance_id or sat.get("state") == "calibrating":
            return
        worker.info = info
        if self.cfg.saturation_flops is None:
            old, worker.theta = worker.theta, float(sat["flops"])
            worker.theta_source = f"worker: {sat.get('source')}"
            log.info("worker %s Θ %s: %.4g -> %.4g FLOPs (%s)", worker.id, sat.get("state"), old, worker.theta,
                     sat.get("source"))
            self.on_change()  # a larger Θ may admit queued work now

    def mark_unhealthy(self, worker: Worker, reason: str) -> None:
        if worker.state == HEALTHY:
            worker.state = UNHEALTHY
            worker.last_error = reason
            log.warning("worker %s (%s) taken out of rotation: %s", worker.id, worker.url, reason)

    async def _readmit(self, worker: Worker) -> None:
        try:
            info = await self._fetch_info(worker.url)
        except WorkerError as exc:
            worker.last_error = exc.message
            return
        if info.get("instance_id") != worker.instance_id:
            worker.counters.restarts += 1
            for rank, slot in worker.slots.items():
                dropped = self.index.clear_committed(slot)
                log.info("worker %s restarted (new instance %s): dropped %d committed blocks of rank %d",
                         worker.id, info.get("instance_id"), dropped, rank)
            worker.info = info
            if self.cfg.saturation_flops is None:
                worker.theta = float(info["saturation"]["flops"])
                worker.theta_source = f"worker: {info['saturation']['source']}"
        worker.state = HEALTHY
        log.info("worker %s (%s) back in rotation", worker.id, worker.url)
        self.on_change()

    # -- KV events (EventSink) ---------------------------------------------------------------
    def on_batch(self, source: EventSource, batch: EventBatch) -> None:
        worker = self.workers.get(source.worker_id)
        if worker is None:
            return
        slot = worker.slots.get(source.dp_rank if batch.dp_rank is None else batch.dp_rank)
        if slot is None:
            return
        stored = False
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.lora_name is not None or event.lora_id is not None:
                    continue  # adapter namespace: not routed with affinity (see block_hash)
                self.index.store(slot, event.block_hashes)
                worker.counters.events_stored += len(event.block_hashes)
                stored = True
            elif isinstance(event, BlockRemoved):
                self.index.remove(slot, event.block_hashes)
                worker.counters.events_removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                dropped = self.index.clear_committed(slot)
                worker.counters.events_cleared += 1
                log.info("worker %s rank %d cleared its cache: dropped %d committed blocks",
                         worker.id, source.dp_rank, dropped)
        if stored:
            self.ledger.on_stored(slot)
            self.on_change()  # queued requests may wait for exactly these blocks

    def on_reset(self, source: EventSource, reason: str) -> None:
        worker = self.workers.get(source.worker_id)
        if worker is None:
            return
        slot = worker.slots.get(source.dp_rank)
        if slot is None:
            return
        dropped = self.index.clear_committed(slot)
        worker.counters.table_resets += 1
        log.info("worker %s rank %d committed table reset (%s): dropped %d blocks",
                 worker.id, source.dp_rank, reason, dropped)
