"""The worker pool: which workers the router knows, which are in rotation, and which slot is whose.

Each worker is learned from its URL alone (``discovery``): model, page size, context length, tokenizer,
FLOPs constants, Θ and KV-event endpoints, one BlockIndex target per attention-DP rank. A plain SGLang
worker is learned from SGLang's own endpoints and the router's flags (``plain_worker``). The pool's parts
keep it current: ``health`` takes workers out of rotation and back, ``events`` applies their KV events
to the committed tables.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import aiohttp

from sgl_moe.kv_event_keys import load_client_keys
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership import calibration_pool
from sgl_moe.router.membership.discovery import Discovery, check_compatible
from sgl_moe.router.membership.event_sink import KvEventSink
from sgl_moe.router.membership.health import HealthMonitor
from sgl_moe.router.membership.plain_worker import PlainWorkers
from sgl_moe.router.membership.tokenizer_probe import TOKENIZE_PATH, TokenizerCheck, check_worker
from sgl_moe.router.membership.worker import HEALTHY, STARTING, UNHEALTHY, NotAWorker, Worker, WorkerError
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.request.request_limits import RequestLimits
from sgl_moe.router.request.router_tokenizer import RouterTokenizer, freeze_what_loading_made
from sgl_moe.wire import WorkerInfo

log = logging.getLogger("sgl_moe.router.workers")

DEATH_PROBE_S = 2.0
"""After a request's connection to a worker broke, how long ``died`` looks for the worker's process."""


class WorkerPool:
    """All workers the router knows (membership), with their ``discovery``, ``health`` and ``events`` parts."""

    def __init__(self, cfg: RouterConfig, index: BlockIndex, ledger: PendingLedger,
                 session: aiohttp.ClientSession | None, on_change: Callable[[], None]) -> None:
        self.cfg = cfg
        self.index = index
        self.ledger = ledger
        self.on_change = on_change
        """Called when capacity may have appeared (a worker added or back in rotation, blocks stored)."""
        self.workers: dict[str, Worker] = {}
        self.tokenizer: RouterTokenizer | None = None
        self.tokenizer_source: tuple[str, WorkerInfo] | None = None
        """(URL, info) of the worker the tokenizer was loaded from (front processes load theirs from it too)."""
        self.plain = PlainWorkers(cfg)
        """Plain SGLang workers: their info built from SGLang's endpoints and the router's flags."""
        self.discovery = Discovery(session, self.plain)
        self.health = HealthMonitor(self, self.discovery)
        curve = load_client_keys(cfg.kv_events_keys) if cfg.kv_events_keys else None  # checked by cfg.validate
        self.events = KvEventSink(self.workers, index, ledger, on_change, cfg.drop_seqs(), curve)
        self.limits = self.flag_limits()
        """What one request may ask for (``request_limits``): the flags, and the model's shape once known."""
        self._reference: WorkerInfo | None = None
        """The first worker's info: every later one must match it (``check_compatible``)."""
        self._next_id = 0
        self._slot_owner: dict[int, Worker] = {}
        self._adding: set[str] = set()
        self.tokenizer_mismatches = 0
        """Workers whose own ids differed from the router's on the probe set (``tokenizer_probe``)."""
        self._closing = False
        self.calibrations = calibration_pool.CalibrationPool()
        self.installs = 0
        """Infos installed on this pool's workers, joins included (``admit``, ``install``): a Θ or a request
        overhead may have changed since, so a load-ordered view built before the latest is rebuilt
        (``Scheduler.uniform_view``)."""

    @classmethod
    def without_http(cls, cfg: RouterConfig, index: BlockIndex, ledger: PendingLedger,
                     on_change: Callable[[], None]) -> WorkerPool:
        """Hook for the simulator: a pool with no HTTP session, whose workers join through ``admit``
        (no discovery, no health checks, no event listeners; events are delivered to ``events.on_batch``)."""
        return cls(cfg, index, ledger, None, on_change)

    @property
    def model_name(self) -> str | None:
        return self._reference.model_name if self._reference else None

    @property
    def context_length(self) -> int:
        return self._reference.context_length if self._reference else 0

    @property
    def page_size(self) -> int:
        return self._reference.page_size if self._reference else 0

    # -- joining and leaving ---------------------------------------------------------------------
    async def add(self, url: str) -> Worker:
        """Discover the worker at ``url`` and admit it; listeners for its KV events start at once."""
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise WorkerError(400, f"worker URL must start with http:// or https://, got {url!r}")
        if url in self._adding or any(w.url == url for w in self.workers.values()):
            raise WorkerError(409, f"worker {url} is already registered")
        self._adding.add(url)
        try:
            try:
                info = await self.discovery.fetch_info(url)
            except WorkerError as exc:
                if exc.status == 502 or not exc.sglang:
                    raise NotAWorker(exc.status, exc.message) from None
                raise
            check_compatible(url, info, self._reference)
            self.check_new_instance(url, info)
            if self.tokenizer is None:
                self.tokenizer = await self.discovery.fetch_tokenizer(url, info)
                freeze_what_loading_made()
                self.tokenizer_source = (url, info)
                if not self.cfg.prefix_memo:
                    self.tokenizer.drop_memo("--no-prefix-memo")
            check = await self.verify_tokenizer(url, self.tokenizer)
            learned = self.plain.learned_about(url, info)
            self.check_new_instance(url, info)  # again: another URL of the same worker may have joined meanwhile
            worker = self.admit(url, info, learned=learned)
            worker.last_progress = time.monotonic()  # it just answered
            self.limits = replace(self.limits, vocab_size=self._reference.vocab_size,
                                  hidden_size=self._reference.hidden_size,
                                  chars_per_token=self.tokenizer.max_token_chars)
            worker.tokenizer_check = check
            if info.calibrating:  # its /health says 503 until the profile ends: no traffic into the profile
                worker.state = STARTING
                worker.last_error = "starting: its Θ profile runs; in rotation once its /health answers 200"
            self.events.attach(worker)
            log.info("added worker %s at %s: model %s, page size %d, %d DP rank(s), Θ = %.3g FLOPs (%s)%s",
                     worker.id, url, info.model_name, worker.page_size, len(worker.slots), worker.theta,
                     worker.theta_source, "; a plain SGLang worker, learned: " +
                     "; ".join(f"{k}: {v}" for k, v in learned.items()) if learned else "")
        finally:
            self._adding.discard(url)
        self.on_change()
        return worker

    def check_new_instance(self, url: str, info: WorkerInfo) -> None:
        """Refuse a worker already in the pool under another URL (same ``instance_id``): its capacity would count
        twice."""
        if info.instance_id is None:
            return
        for w in self.workers.values():
            if w.instance_id == info.instance_id:
                raise WorkerError(409, f"worker {url} is already registered as {w.id} ({w.url}): same instance id "
                                       f"{info.instance_id}")

    async def died(self, worker: Worker) -> bool:
        """Whether the worker's process is gone, after a request to it broke: a refused connection (or no answer
        within ``DEATH_PROBE_S``) means dead; any HTTP answer from SGLang's ``/model_info`` means alive."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEATH_PROBE_S
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return True
            try:
                async with await self.discovery.get(f"{worker.url}/model_info", timeout=left):
                    return False
            except aiohttp.ClientConnectorError:
                return True
            except (TimeoutError, aiohttp.ClientError):
                await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))

    async def verify_tokenizer(self, url: str, tok: RouterTokenizer) -> TokenizerCheck:
        """Compare the router's ids with the joining worker's (``tokenizer_probe``); on a difference, mark the
        tokenizer inexact (one warning line, from ``mark_inexact``); unavailable: one warning, exact kept."""
        check = await check_worker(self.discovery.session, url, tok)
        if check.state == "mismatch":
            self.tokenizer_mismatches += 1
            d = check.first_difference or {}
            tok.mark_inexact(f"worker {url}: its {TOKENIZE_PATH} ids differ from the router's on probe "
                             f"{d.get('probe')!r} at position {d.get('position')} (router {d.get('router_id')}, "
                             f"worker {d.get('worker_id')}); routing without prefix affinity, text forwarded as sent")
        elif check.state == "unavailable":
            log.warning("worker %s: cannot verify the router's tokenizer against it (%s); keeping it %s as loaded",
                        url, check.detail, "exact" if tok.exact else "inexact")
        return check

    def admit(self, url: str, info: WorkerInfo, *, worker_id: str | None = None,
              learned: dict[str, str] | None = None) -> Worker:
        """A worker whose info is known joins: compatibility, Θ, one BlockIndex target per attention-DP rank.

        The synchronous part of ``add`` (no HTTP, no listeners, no ``on_change``). Hook for the simulator,
        which admits its simulated workers under their own ids (default: ``w0``, ``w1``, ... in order).
        ``learned``: for a plain SGLang worker, where each field of ``info`` came from (``Worker.learned``).
        """
        check_compatible(url, info, self._reference)
        worker = Worker.from_info(worker_id or f"w{self._next_id}", url, info, self.cfg.saturation_flops, learned,
                                  self.cfg.request_overhead_flops)
        self.installs += 1
        self._next_id += 1
        if self._reference is None:
            self._reference = info
        ranks = [e.dp_rank for e in info.kv_events] or list(range(max(1, info.dp_size)))
        for rank in ranks:
            slot = self.index.add_target()
            worker.slots[rank] = slot
            self._slot_owner[slot] = worker
        self.workers[worker.id] = worker
        self.pool_calibrations()
        return worker

    def install(self, worker: Worker, info: WorkerInfo) -> None:
        """Install the worker's latest info and its Θ (``Worker.install``, with the router's pins), and count it."""
        worker.install(info, self.cfg.saturation_flops, self.cfg.request_overhead_flops)
        self.installs += 1
        self.pool_calibrations()

    def pool_calibrations(self) -> None:
        """Workers of one kind share the median of their calibrations (``calibration_pool``); after every install
        and removal, since each changes a kind's samples."""
        if not self.cfg.pool_calibrations or self._closing:
            return
        if self.calibrations.pool(self.workers.values(), theta_pinned=self.cfg.saturation_flops is not None,
                                  overhead_pinned=self.cfg.request_overhead_flops is not None):
            self.installs += 1  # a Θ or a request overhead changed: load-ordered views are rebuilt

    async def remove(self, worker_id: str) -> Worker:
        worker = self.workers.pop(worker_id, None)
        if worker is None:
            raise WorkerError(404, f"no worker with id {worker_id!r}; GET /workers lists them")
        self.events.detach(worker)
        for slot in worker.slots.values():
            committed, pending = self.index.sizes(slot)
            self.index.remove_target(slot)
            self.ledger.forget_slot(slot)
            self._slot_owner.pop(slot, None)
            log.info("removed worker %s: purged %d committed and %d pending blocks", worker.id, committed, pending)
        worker.state = "removed"
        self.pool_calibrations()
        if not self.workers:
            self._reference = None
            self.tokenizer = None
            self.tokenizer_source = None
            self.limits = self.flag_limits()
        return worker

    def flag_limits(self) -> RequestLimits:
        """The request limits the router's flags set (the model's shape is added when a worker joins)."""
        c = self.cfg
        return RequestLimits(c.max_prompts, c.max_request_tokens, max_n=c.max_n, max_grammar_chars=c.max_grammar_chars,
                             max_grammar_depth=c.max_grammar_depth)

    async def close(self) -> None:
        self._closing = True  # no re-pooling of calibrations as the workers leave one by one
        for worker_id in list(self.workers):
            await self.remove(worker_id)

    # -- rotation ------------------------------------------------------------------------------
    def routable(self, exclude: frozenset[str] = frozenset()) -> list[Worker]:
        return [w for w in self.workers.values() if w.state == HEALTHY and w.id not in exclude]

    def any_healthy(self) -> bool:
        return any(w.state == HEALTHY for w in self.workers.values())

    def worker_of_slot(self, slot: int) -> Worker | None:
        return self._slot_owner.get(slot)

    def worker_at(self, url: str) -> Worker | None:
        """The worker at ``url`` (router replicas name workers by URL)."""
        url = url.rstrip("/")
        return next((w for w in self.workers.values() if w.url == url), None)

    def mark_unhealthy(self, worker: Worker, reason: str) -> None:
        if worker.state == HEALTHY:
            worker.state = UNHEALTHY
            worker.last_error = reason
            log.warning("worker %s (%s) taken out of rotation: %s", worker.id, worker.url, reason)

    def mark_healthy(self, worker: Worker) -> None:
        worker.state = HEALTHY
        log.info("worker %s (%s) back in rotation", worker.id, worker.url)
        self.on_change()

    async def health_loop(self) -> None:
        """The pool's background task: ``health.run``."""
        await self.health.run()
