"""The router's HTTP service: proxying with placement, retries, worker admin, health and metrics.

Responses from workers reach the client byte for byte (status, body, content type); the router
adds only ``x-sgl-moe-*`` headers saying where the request went and what it predicted. ``forwarding`` owns
sending a placed request to its worker and relaying the answer (the ``Router``'s ``Forwarder``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from sgl_moe.router.config import SECRET_FIELDS, RouterConfig
from sgl_moe.router.errors import RequestError, WorkerFailure, error_response, json_errors, request_error_response
from sgl_moe.router.front.answer import web_answers
from sgl_moe.router.front.arrival_order import ArrivalOrder
from sgl_moe.router.front.attempt import PROXIED, Attempt, worker_auth_headers
from sgl_moe.router.front.auth import auth_middleware
from sgl_moe.router.front.classify_route import classify
from sgl_moe.router.front.forwarding import Forwarder
from sgl_moe.router.front.front_processes import FrontProcesses, FrontSockets, FrontStartError
from sgl_moe.router.front.front_router import FAILED_WORKER_HEADER, FAILURE_HEADER
from sgl_moe.router.front.http_server import BareCounts, BareRequest, Handoff, HotRoutes, router_routes
from sgl_moe.router.front.intake import parse, read_body
from sgl_moe.router.front.metrics import RouterMetrics
from sgl_moe.router.front.request_ids import new_rid
from sgl_moe.router.front.worker_client import WorkerClient
from sgl_moe.router.membership.worker import NotAWorker, Worker, WorkerError
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.job import Job, Placement
from sgl_moe.router.placement.messages import Model, Refused
from sgl_moe.router.placement.owner import PlacementOwner, Screen
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.quarantine import QuarantineLane
from sgl_moe.router.placement.scheduler import NoWorkers, QueueFull, QueueTimeout, Scheduler, refusal
from sgl_moe.router.placement.suspects import Suspect, SuspectList
from sgl_moe.router.replicas.messages import Load
from sgl_moe.router.replicas.peer_link import PeerLink, public_url
from sgl_moe.router.replicas.peer_tables import PeerTables
from sgl_moe.router.replicas.shared_placement import Refusal, SharedPlacement
from sgl_moe.router.request.parsed_request import ParsedRequest
from sgl_moe.router.request.prompt_keys import prompt_keys
from sgl_moe.wire import to_builtins

log = logging.getLogger("sgl_moe.router")


RESPONSE_HEADERS = ("content-type",)


class Router:
    """The app's state and handlers; ``run`` and ``forwarder.forward`` are the hooks other routes (classify)
    use."""

    def __init__(self, cfg: RouterConfig, sockets: FrontSockets | None = None) -> None:
        self.cfg = cfg
        self.sockets = sockets
        """With ``--front-processes`` > 1: the Unix sockets this router (the placement owner) serves its fronts on."""
        self.owner: PlacementOwner | None = None
        """Places the fronts' requests (``--front-processes`` > 1)."""
        self.fronts: FrontProcesses | None = None
        self.index = BlockIndex()
        self.ledger = PendingLedger(self.index, cfg.pending_ttl_s)
        self.session: aiohttp.ClientSession | None = None
        self.pool: WorkerPool | None = None
        self.scheduler: Scheduler | None = None
        self.lane: QuarantineLane | None = None
        """Suspects run here, alone and one at a time (``quarantine``)."""
        self.metrics = RouterMetrics(self)
        self.suspects = SuspectList(cfg.suspect_ttl_s)
        self.forwarder: Forwarder | None = None
        """Sends placed requests to their workers and relays the answers (``forwarding``); made in ``start``."""
        self._tasks: list[asyncio.Task] = []
        self.order = ArrivalOrder()
        """Requests are placed in the order their bodies arrived (``arrival_order``), wherever they were parsed."""
        self._pump_due = False
        """A pump is scheduled for the next turn of the event loop (``_on_capacity``)."""
        self.peers: PeerLink | None = None
        """The link to the other router replicas (``--peers``); None: this router runs alone."""
        self.bare_counts: BareCounts | None = None
        """What the bare HTTP protocols did (``--http-server bare``; None: every request on aiohttp)."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=self.cfg.worker_keepalive_s),
            timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s, connect=10),
            auto_decompress=False, headers=worker_auth_headers(self.cfg))
        self.pool = WorkerPool(self.cfg, self.index, self.ledger, self.session, on_change=self._on_capacity)
        self.scheduler = Scheduler(self.cfg, self.pool, self.index, self.ledger)
        self.scheduler.pump_soon = self._on_capacity
        self.forwarder = Forwarder(
            WorkerClient(total_timeout_s=self.cfg.request_timeout_s, connect_timeout_s=10,
                         keepalive_s=self.cfg.worker_keepalive_s, headers=worker_auth_headers(self.cfg)),
            self.session, self._release, self.cfg.abort_timeout_s)
        self.lane = QuarantineLane(self.scheduler, self.pool, self.cfg.queue_timeout_s)
        self._tasks.append(asyncio.create_task(self.pool.health_loop(), name="health"))
        for url in self.cfg.worker_urls:
            self._tasks.append(asyncio.create_task(self._add_initial(url), name=f"add {url}"))
        if self.sockets is not None:
            await self._start_fronts(self.sockets)
        if self.cfg.peers is not None:
            await self._start_peers()

    async def _start_peers(self) -> None:
        """Share pending blocks and load with the other replicas through the broker (``replicas``)."""
        cfg, pool, sched = self.cfg, self.pool, self.scheduler

        worker_at = pool.worker_at

        def slot_of(url: str, rank: int) -> int | None:
            w = worker_at(url)
            return w.slots.get(rank) if w is not None else None

        def where(slot: int) -> tuple[str, int] | None:
            w = pool.worker_of_slot(slot)
            if w is None:
                return None
            return w.url, next(r for r, s in w.slots.items() if s == slot)

        def set_peer_load(url: str, flops: float) -> None:
            w = worker_at(url)
            if w is not None and w.peer_flops != flops:
                sched.set_peer_load(w, flops)

        def own_load() -> Load:
            return Load({w.url: (w.inflight_flops - w.peer_flops if w.inflight_requests else 0.0)
                         for w in pool.workers.values()}, len(sched.queue))

        def peer_dropped(replica: str, why: str) -> None:
            if self.peers is not None and self.peers.placing is not None:
                self.peers.placing.peer_gone(replica, why)

        tables = PeerTables(index=self.index, slot_of=slot_of, set_peer_load=set_peer_load,
                            timeout_s=cfg.peer_timeout_s, on_drop=peer_dropped)
        self.peers = link = PeerLink(url=cfg.peers, subject=f"sgl_moe.router.{cfg.peers_cluster}",
                                     replica=cfg.replica_name, token=cfg.peers_token, tables=tables, where=where,
                                     own_load=own_load, heartbeat_s=cfg.peer_heartbeat_s)
        if cfg.replica_placement == "owner":
            hooks = PlacementOwner(sched.acquire, sched.release, _refused, self._screen, self.observe,
                                   self.model_message)
            link.placing = SharedPlacement(name=link.replica, since=link.since, owner=hooks, send=link.send,
                                           peers_since=tables.since, connected=link.connected,
                                           answer_timeout_s=cfg.queue_timeout_s + cfg.peer_timeout_s)
        self.ledger.observer = self.peers
        sched.on_load = self.peers.load_changed
        await self.peers.start()

    async def _start_fronts(self, sockets: FrontSockets) -> None:
        """Serve placements on ``sockets.placement`` and start the front processes; wait until each connected."""
        self.owner = PlacementOwner(self.scheduler.acquire, self.scheduler.release, _refused, self._screen,
                                    self.observe, self.model_message)
        await self.owner.serve(sockets.placement)
        self.fronts = FrontProcesses(self.cfg, sockets)
        self.fronts.start()
        deadline = time.monotonic() + FRONT_START_S
        while len(self.owner.fronts) < self.cfg.front_processes:
            if time.monotonic() > deadline or self.fronts.stopping:
                raise FrontStartError(f"only {len(self.owner.fronts)} of {self.cfg.front_processes} front processes "
                                   f"connected within {FRONT_START_S:.0f} s (their log lines say why)")
            await asyncio.sleep(0.05)
        log.info("%d front processes connected; this process owns placement", len(self.owner.fronts))

    async def stop(self, app: web.Application) -> None:
        if self.peers is not None:
            await self.peers.close()
        if self.fronts is not None:
            await self.fronts.stop()
        if self.owner is not None:
            await self.owner.close()
        for task in self._tasks:
            task.cancel()
        if self.forwarder:
            self.forwarder.cancel()
        if self.pool:
            await self.pool.close()
        if self.session:
            await self.session.close()

    def _on_capacity(self) -> None:
        """Stored blocks, a new Θ or a finished request (``Scheduler.pump_soon``) may let queued requests run: pump
        once on the next turn of the event loop.

        One pump per turn, not one per KV-event batch: a router (re)started in front of long-running workers
        replays their event buffers (thousands of batches each), and a pump per batch re-scored up to
        ``PUMP_SCAN_LIMIT`` queued requests each time (measured: 20-30 s of router CPU during a 600-request
        bulk run, throughput 0.1x the same router's once the buffers were short)."""
        if self.lane is not None:
            self.lane.notify()
        if self.owner is not None:
            self.owner.refresh_model(self._model_key())
        if self.scheduler is None or self._pump_due:
            return
        self._pump_due = True
        asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_due = False
        if self.scheduler is not None:
            self.scheduler.pump()

    async def _add_initial(self, url: str) -> None:
        """Add a worker given on the command line; keep trying while it is still starting."""
        delay = 1.0
        while True:
            try:
                await self.pool.add(url)
                return
            except WorkerError as exc:
                if exc.status != 502:
                    log.error("not adding worker %s: %s", url, exc.message)
                    return
                log.info("worker %s not reachable yet (%s); retrying in %.0f s", url, exc.message, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    # -- proxied endpoints -------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        endpoint = request.path
        t0 = time.perf_counter()
        # A bare request's body came whole and within the limits (``http_server``): no read to wait for.
        raw = request.body if type(request) is BareRequest else await read_body(request, self.cfg)
        if type(raw) is not bytes and isinstance(raw, web.Response):  # (a Response is an ABC: its isinstance is a call)
            resp = raw
        elif self.pool.tokenizer is None:
            resp = error_response(503, "no worker is registered yet; add one with POST /workers or wait for the "
                                  "workers given with --worker-urls to start", kind="unavailable",
                                  headers={"Retry-After": "5"})
        else:
            rid = request.headers.get("x-request-id") or new_rid()
            ticket = self.order.ticket()
            try:
                resp = await self._handle_in_order(request, endpoint, raw, rid, ticket)
            finally:
                self.order.leave(ticket)  # an early answer or the client gone: the next request may be placed
        self.metrics.answered(endpoint, resp.status, time.perf_counter() - t0)
        return resp

    async def _handle_in_order(self, request: web.Request, endpoint: str, raw: bytes, rid: str,
                               ticket: int) -> web.StreamResponse:
        pool = self.pool
        t_tok = time.perf_counter()
        try:
            parsed = await parse(endpoint, raw, tokenizer=pool.tokenizer, served_model_name=pool.model_name,
                                 context_length=pool.context_length, limits=pool.limits,
                                 inline_bytes=self.cfg.parse_inline_bytes)
        except RequestError as exc:
            return request_error_response(exc)
        self.metrics.tokenize_seconds.observe(time.perf_counter() - t_tok)
        if parsed.stream and type(request) is BareRequest:  # a streamed answer is aiohttp's to write
            raise Handoff
        if not self.order.is_turn(ticket):
            await self.order.wait_turn(ticket)
        attempt = Attempt.of(endpoint, parsed.body, request.headers,
                             pass_authorization=self.cfg.api_key is None and self.cfg.admin_api_key is None,
                             input_ids_json=parsed.input_ids_json())
        refusal = self.refuse_suspect(rid, attempt)
        if refusal is not None:
            return refusal
        failed = self._front_failure(request) if self.owner is not None else None
        # ``run`` places (or queues) the request before its first await; the next ticket's task resumes only then.
        self.order.leave(ticket)
        if parsed.stream:
            return await self.run(rid, parsed, lambda p: self.forwarder.stream(request, attempt, p), attempt, failed)
        return await self.run(rid, parsed, lambda p: self.forwarder.forward(attempt, p), attempt, failed)

    @staticmethod
    def _front_failure(request: web.Request) -> tuple[str, WorkerFailure] | None:
        """The failed first try a front process handed on with this request (``front_router``), if any; only the
        fronts reach this router's socket when it has them."""
        worker_id = request.headers.get(FAILED_WORKER_HEADER)
        if worker_id is None:
            return None
        try:
            f = orjson.loads(request.headers.get(FAILURE_HEADER, "{}"))
            exc = WorkerFailure(str(f["message"]), connect=bool(f["connect"]), transport=bool(f["transport"]),
                                timeout=bool(f["timeout"]))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            exc = WorkerFailure("failed (the front's account of it was unreadable)")
        return worker_id, exc

    def _screen(self, fingerprint: bytes) -> Screen:
        """For a front's request: refuse it (poison), run it here (a suspect, alone), or place it."""
        suspect = self.suspects.find(fingerprint)
        if suspect is None:
            return PLACE
        if suspect.poison:
            self.suspects.refused += 1
            return Screen("refuse", self._poison_message(suspect))
        return Screen("delegate")

    def _model_key(self) -> tuple:
        """What ``model_message`` depends on, cheaply (checked on every capacity change)."""
        pool, tok = self.pool, self.pool.tokenizer
        return (id(tok), tok is not None and tok.exact, pool.tokenizer_source and pool.tokenizer_source[0],
                pool.limits, pool.page_size, pool.context_length)

    def model_message(self) -> Model:
        """What the fronts need to parse requests (``messages.Model``)."""
        pool = self.pool
        if pool is None or pool.tokenizer is None or pool.tokenizer_source is None:
            return Model(memo=self.cfg.prefix_memo)
        url, info = pool.tokenizer_source
        tok = pool.tokenizer
        return Model(url, to_builtins(info), pool.model_name, pool.context_length, pool.page_size,
                     dataclasses.asdict(pool.limits), pool.plain.learned_about(url, info) is not None,
                     None if tok.exact else tok.inexact_reason, self.cfg.prefix_memo)

    def refuse_suspect(self, rid: str, attempt: Attempt) -> web.Response | None:
        """The 400 for a poison request (its run alone killed a second worker: ``suspects``), else None."""
        suspect = self.suspects.find(attempt.fingerprint) if self.suspects else None
        if suspect is None or not suspect.poison:
            return None
        self.suspects.refused += 1
        log.warning("refusing request %s: the same request (%s) killed worker %s when it ran there alone %.0f s ago",
                    rid, suspect.rid, suspect.worker_id, time.monotonic() - suspect.at)
        return self._poison_response(suspect)

    def _poison_response(self, suspect: Suspect) -> web.Response:
        return error_response(400, self._poison_message(suspect), kind="request_failed")

    def _poison_message(self, suspect: Suspect) -> str:
        first = f"was running on worker {suspect.first_worker_id} when that worker died, then " \
            if suspect.first_worker_id else ""
        return (f"refused: this request {first}ran alone on worker {suspect.worker_id}, which died too (request "
                f"{suspect.rid}); the router takes it for what killed them and refuses it for "
                f"{self.cfg.suspect_ttl_s:.0f} s (--suspect-ttl-s)")

    async def run(self, rid: str, parsed: ParsedRequest, call: Callable[[Placement], Awaitable[web.StreamResponse]],
                  attempt: Attempt | None = None, failed: tuple[str, WorkerFailure] | None = None
                  ) -> web.StreamResponse:
        """Place the request, run ``call(placement)``, and retry a failed prefill-only request once elsewhere.

        Every router-side refusal (queue full, queue timeout, no workers, worker failure) becomes a JSON error
        response here, so callers always get a response object. The retry rule: a prefill-only request is
        retried once on another worker when its worker answered 5xx, or could not be reached before anything
        was sent; never after a timeout. A request whose worker died while running it (and one the router
        already holds for a suspect, ``suspects``) is retried through the quarantine lane: alone on a healthy
        worker, one suspect at a time. Its worker answering there clears it; that worker dying too convicts it
        (400, and the same request is refused for ``--suspect-ttl-s``). ``failed``: (worker id, failure) of a
        first try a front process made (``--front-processes``); the run goes on from there.
        """
        job = self._job(rid, parsed)
        key: bytes | None = None  # the attempt's fingerprint, made only when something needs it
        if attempt is not None and (self.suspects or failed is not None or self._placing() is not None):
            key = attempt.fingerprint
        suspect = self.suspects.find(key) if key is not None and self.suspects else None
        if suspect is not None and suspect.poison:
            return self._poison_response(suspect)
        run = _Run(alone=suspect is not None)  # a resent suspect runs alone, as its first try did
        retryable = parsed.prefill_only and not parsed.stream
        if failed is not None:
            worker_id, exc = failed
            worker = self.pool.workers.get(worker_id)
            if worker is None:  # removed meanwhile: nothing to learn from it
                job.exclude = frozenset({worker_id})
                run.tries = 1
            else:
                answer = await self._after_failure(job, worker, exc, key, run, retryable)
                if answer is not None:
                    return answer
        while True:
            try:
                placement = await (self.lane.enter(job) if run.alone else self._acquire(job, key))
            except (QueueFull, QueueTimeout, NoWorkers) as exc:
                return error_response(**refusal(exc))
            except Refusal as exc:  # by the replica that owns placement
                r = exc.refused
                return error_response(r.status, r.message, kind=r.kind,
                                      headers={"Retry-After": r.retry_after} if r.retry_after else None)
            if run.alone and key is not None:
                now = self.suspects.find(key)  # another copy's run alone may have told while this one waited
                if now is None or now.poison:
                    self.scheduler.release(placement, ok=False)
                    self.lane.leave()
                    if now is not None:
                        return self._poison_response(now)
                    run.alone = False
                    continue
            self.observe(placement)
            in_lane = run.alone
            try:
                resp = await call(placement)
                if run.alone and key is not None:
                    self.suspects.clear(key)
                    log.warning("request %s ran alone on worker %s, which lived: innocent", rid, placement.worker.id)
                return resp
            except WorkerFailure as exc:
                if key is None and attempt is not None:
                    key = attempt.fingerprint
                answer = await self._after_failure(job, placement.worker, exc, key, run, retryable)
                if answer is not None:
                    return answer
            finally:
                if in_lane:
                    self.lane.leave()

    def _acquire(self, job: Job, fingerprint: bytes | None) -> Awaitable[Placement]:
        """``Scheduler.acquire``, or with one placement owner among the router replicas, its placement."""
        placing = self._placing()
        if placing is None:
            return self.scheduler.acquire(job)
        return placing.acquire(job, fingerprint or b"", self.pool.worker_at, self.scheduler.acquire)

    def _placing(self):
        """The placement owner among the router replicas, when another one places (``shared_placement``)."""
        return self.peers.placing if self.peers is not None else None

    def _release(self, placement: Placement, *, ok: bool) -> None:
        """``Scheduler.release``, or for a placement another replica made, tell it (``Placement.settle``)."""
        if placement.settle is None:
            self.scheduler.release(placement, ok=ok)
        elif not placement.released:
            placement.released = True
            placement.settle(ok)

    async def _after_failure(self, job: Job, worker: Worker, exc: WorkerFailure, key: bytes | None, run: _Run,
                             retryable: bool) -> web.Response | None:
        """``run``'s rule for a failed try on ``worker``: the answer, or None to try again (``job`` and ``run``
        updated)."""
        rid = job.rid
        worker.counters.failures += 1
        self.metrics.worker_failures.labels(worker.id).inc()
        if not exc.connect and await self.pool.died(worker):
            self.pool.mark_unhealthy(worker, f"its process died while running requests ({exc})")
            if run.alone:
                poison = self.suspects.convict(key, rid, worker.id) if key is not None else Suspect(
                    rid, worker.id, time.monotonic(), poison=True)
                log.error("worker %s died running request %s alone (quarantine lane): it is poison, refused "
                          "for %.0f s", worker.id, rid, self.cfg.suspect_ttl_s)
                return self._poison_response(poison)
            if key is not None:
                self.suspects.add(key, Suspect(rid, worker.id, time.monotonic()))
            log.error("worker %s died while running request %s (%s); retrying it alone on another worker "
                      "(quarantine lane): it may be what killed the worker", worker.id, rid, exc)
            job.exclude = job.exclude | {worker.id}
            job.future = None
            run.alone = True
            return None
        if exc.transport:
            self.pool.mark_unhealthy(worker, str(exc))
        if retryable and not exc.timeout and run.tries == 0 and len(self.pool.workers) > 1:
            run.tries += 1
            self.metrics.retries.inc()
            log.warning("request %s failed on %s (%s); retrying once on another worker", rid, worker.id, exc)
            job.exclude = job.exclude | {worker.id}
            job.future = None
            return None
        log.warning("request %s failed on %s: %s", rid, worker.id, exc)
        return error_response(502, f"worker {worker.id} failed: {exc}", kind="worker_failure")

    def observe(self, placement: Placement) -> None:
        """Record a placement's decision time, and its queue wait when it queued."""
        self.metrics.decision_seconds.observe(placement.decision_s)
        if placement.job.queued:
            self.metrics.queue_wait_seconds.observe(placement.queued_s)

    def _job(self, rid: str, parsed: ParsedRequest) -> Job:
        t0 = time.perf_counter()
        job = self._job_of(rid, parsed)
        self.metrics.hash_seconds.observe(time.perf_counter() - t0)
        return job

    def _job_of(self, rid: str, parsed: ParsedRequest) -> Job:
        return Job(rid=rid, prompt_lens=[len(p) for p in parsed.prompts],
                   keys=prompt_keys(parsed, self.pool.page_size), shared_prefix_len=parsed.shared_prefix_len,
                   max_new_tokens=parsed.max_new_tokens)

    # -- other endpoints ---------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        workers = self.pool.routable()
        if not workers:
            return error_response(503, "no healthy worker is available", kind="unavailable")
        try:
            async with self.session.get(workers[0].url + "/v1/models") as resp:
                return web.Response(body=await resp.read(), status=resp.status,
                                    content_type="application/json")
        except (TimeoutError, aiohttp.ClientError) as exc:
            return error_response(502, f"worker {workers[0].id} failed: {exc}", kind="worker_failure")

    async def health(self, request: web.Request) -> web.Response:
        healthy = len(self.pool.routable())
        body = {"status": "ok" if healthy else "unavailable", "healthy_workers": healthy,
                "workers": len(self.pool.workers), "queue_depth": len(self.scheduler.queue)}
        if self.peers is not None and healthy and not self.peers.warm():
            # A replica takes traffic once it holds the other replicas' state (or gave up waiting for the broker).
            body["status"] = "unavailable"
            body["waiting_for"] = "the other router replicas' state through the broker (--peers)"
            healthy = 0
        return web.Response(body=orjson.dumps(body), status=200 if healthy else 503, content_type="application/json")

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def list_workers(self, request: web.Request) -> web.Response:
        body = {"workers": [w.describe(self.index) for w in self.pool.workers.values()],
                "policy": self.cfg.policy, "queue_depth": len(self.scheduler.queue),
                "peers": self.peers.describe() if self.peers is not None else None}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def add_worker(self, request: web.Request) -> web.Response:
        try:
            data = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"body is not valid JSON: {exc}")
        if not isinstance(data, dict) or not isinstance(data.get("url"), str) or set(data) - {"url"}:
            return error_response(400, 'body must be {"url": "http://host:port"}')
        try:
            worker = await self.pool.add(data["url"])
        except NotAWorker as exc:
            log.warning("POST /workers %s refused: %s", data["url"], exc.message)
            return error_response(400, "the URL did not answer as an SGLang worker (the router's log has the "
                                       "details)")
        except WorkerError as exc:
            return error_response(exc.status, exc.message)
        return web.Response(body=orjson.dumps(worker.describe(self.index)), status=201,
                            content_type="application/json")

    async def remove_worker(self, request: web.Request) -> web.Response:
        try:
            worker = await self.pool.remove(request.match_info["worker_id"])
        except WorkerError as exc:
            return error_response(exc.status, exc.message)
        self.scheduler.pump()  # queued requests excluded from nothing may now find no worker: answer them
        if self.owner is not None:
            self.owner.refresh_model(self._model_key())
        return web.Response(body=orjson.dumps({"removed": worker.id, "url": worker.url}),
                            content_type="application/json")


@dataclass(slots=True, init=False)
class _Run:
    """Where one request's tries stand (``Router.run``)."""

    alone: bool
    """The next try runs in the quarantine lane."""
    tries: int = 0
    """Retries used on other workers (at most one)."""

    def __init__(self, alone: bool, tries: int = 0) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.alone = alone
        self.tries = tries


ROUTER = web.AppKey("router", Router)
"""The app's ``Router`` (``build_app(cfg)[ROUTER]``)."""


def tune_gc() -> None:
    """Fewer, cheaper garbage collections: routing allocates many short-lived objects per request, and a
    young-generation pass every 700 allocations shows up in the decision-time tail (p99 ~1.2 ms -> ~0.9 ms at
    64 workers). Objects alive at start-up are frozen out of collection."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _refused(exc: Exception) -> Refused | None:
    """A front's ``Refused`` for a placement error (``PlacementOwner.refusal``)."""
    if not isinstance(exc, (QueueFull, QueueTimeout, NoWorkers)):
        return None
    r = refusal(exc)
    return Refused(-1, r["status"], r["message"], r["kind"], r["headers"].get("Retry-After"))


PLACE = Screen("place")
FRONT_START_S = 60.0
"""How long the owner waits for its front processes to connect at start-up."""


def build_app(cfg: RouterConfig, sockets: FrontSockets | None = None) -> web.Application:
    """The router's app; with ``sockets`` (``--front-processes`` > 1) the placement owner's, which front processes
    stand in front of."""
    router = Router(cfg, sockets)
    app = web.Application(client_max_size=cfg.max_body_bytes,
                          middlewares=[json_errors, auth_middleware(cfg), web_answers])
    app[ROUTER] = router

    async def classify_route(request: web.Request) -> web.Response:
        return await classify(router, request)

    for path in PROXIED:
        app.router.add_post(path, router.handle)
    app.router.add_post("/v1/classify", classify_route)
    app.router.add_get("/v1/models", router.models)
    app.router.add_get("/health", router.health)
    app.router.add_get("/metrics", router.metrics_text)
    app.router.add_get("/workers", router.list_workers)
    app.router.add_post("/workers", router.add_worker)
    app.router.add_delete("/workers/{worker_id}", router.remove_worker)
    app.on_startup.append(router.start)
    app.on_cleanup.append(router.stop)
    return app


def hot_routes(app: web.Application) -> HotRoutes:
    """The proxied routes, for ``http_server.serve`` to answer on bare protocols (``--http-server bare``)."""
    router = app[ROUTER]
    hot = router_routes(router.cfg, router.handle)
    router.bare_counts = hot.counts
    return hot


def describe_config(cfg: RouterConfig) -> dict[str, Any]:
    """The settings, keys redacted."""
    shown = {k: ("<set>" if getattr(cfg, k) else None) if k in SECRET_FIELDS else getattr(cfg, k)
             for k in cfg.__dataclass_fields__}
    if cfg.peers:
        shown["peers"] = public_url(cfg.peers)  # without a user:password it may carry
    return shown
