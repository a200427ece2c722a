"""One front process of ``--front-processes N``: it takes clients' requests on the router's port (each front on
its own ``SO_REUSEPORT`` socket), parses, tokenizes and hashes them, asks the placement owner where each runs
(``placement_client``), forwards it to that worker and relays the answer.

What a front does not do itself it hands to the owner's own HTTP service (on a Unix socket) as the client sent it:
every route but the proxied inference routes (``/v1/classify``, ``/workers``, ``/health``, ``/metrics``,
``/v1/models``), a request the owner holds for a suspect, and a request whose worker failed it (the owner then
applies the router's retry and quarantine rule, ``Router.run``, from that failure on).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.errors import RequestError, WorkerFailure, error_response, json_errors, request_error_response
from sgl_moe.router.front.answer import web_answers
from sgl_moe.router.front.arrival_order import ArrivalOrder
from sgl_moe.router.front.attempt import PROXIED, Attempt, worker_auth_headers
from sgl_moe.router.front.auth import auth_middleware
from sgl_moe.router.front.forwarding import Forwarder
from sgl_moe.router.front.http_server import BareRequest, Handoff, HotRoutes, router_routes
from sgl_moe.router.front.intake import parse, read_body
from sgl_moe.router.front.placement_client import OwnerGone, PlacementClient
from sgl_moe.router.front.request_ids import new_rid
from sgl_moe.router.front.worker_client import WorkerClient
from sgl_moe.router.membership.discovery import Discovery
from sgl_moe.router.membership.plain_worker import PlainWorkers
from sgl_moe.router.membership.worker import WorkerError
from sgl_moe.router.placement.messages import Delegate, Model, Refused
from sgl_moe.router.request.prompt_keys import prompt_keys
from sgl_moe.router.request.request_limits import RequestLimits
from sgl_moe.router.request.router_tokenizer import RouterTokenizer, freeze_what_loading_made
from sgl_moe.wire import decode_info

log = logging.getLogger("sgl_moe.router.fronts")

FAILED_WORKER_HEADER = "x-sgl-moe-failed-worker"
"""On a request a front hands the owner after its worker failed it: that worker's id."""
FAILURE_HEADER = "x-sgl-moe-failure"
"""With it: the failure as JSON (``WorkerFailure``'s message and flags)."""
LOAD_WAIT_S = 60.0
"""How long a request that arrives while this front loads the tokenizer waits for it."""
HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


@dataclass(slots=True)
class _Tally:
    predicted_cached_tokens: int = 0
    reported_cached_tokens: int = 0


@dataclass(slots=True)
class FrontWorker:
    """The placed worker as a front knows it (what ``Forwarder`` reads and writes)."""

    id: str
    url: str
    counters: _Tally = dataclasses.field(default_factory=_Tally)
    last_progress: float = 0.0


@dataclass(slots=True)
class FrontJob:
    rid: str


@dataclass(slots=True)
class FrontPlacement:
    """The owner's ``Placed`` for one request (what ``Forwarder`` reads)."""

    req: int
    job: FrontJob
    worker: FrontWorker
    predicted_cached_tokens: int
    queued_s: float
    reason: str
    reported_cached_tokens: int = -1


@dataclass(frozen=True)
class FrontModel:
    """What parsing needs, from the owner's ``Model``."""

    tokenizer: RouterTokenizer
    model_name: str | None
    context_length: int
    page_size: int
    limits: RequestLimits


class FrontRouter:
    """A front process's app state and handlers."""

    def __init__(self, cfg: RouterConfig, front: int, placement_socket: str, owner_socket: str) -> None:
        self.cfg = cfg
        self.front = front
        self.placement_socket = placement_socket
        self.owner_socket = owner_socket
        self.session: aiohttp.ClientSession | None = None
        """To the workers."""
        self.owner: aiohttp.ClientSession | None = None
        """To the owner's HTTP service (Unix socket)."""
        self.client = PlacementClient(front, self._on_model, self._on_lost)
        self.forwarder: Forwarder | None = None
        self.model: FrontModel | None = None
        self._model_msg: Model | None = None
        self._model_task: asyncio.Task | None = None
        self._tokenizer_source: tuple | None = None
        """(worker URL, its ``TokenizerFiles``) the loaded tokenizer came from."""
        self.order = ArrivalOrder()

    async def start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=self.cfg.worker_keepalive_s),
            timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s, connect=10),
            auto_decompress=False, headers=worker_auth_headers(self.cfg))
        self.owner = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.owner_socket),
                                           timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        self.forwarder = Forwarder(
            WorkerClient(total_timeout_s=self.cfg.request_timeout_s, connect_timeout_s=10,
                         keepalive_s=self.cfg.worker_keepalive_s, headers=worker_auth_headers(self.cfg)),
            self.session, self._release, self.cfg.abort_timeout_s, self._note_cached)
        await self.client.connect(self.placement_socket)

    async def stop(self, app: web.Application) -> None:
        self.client.close()
        if self.forwarder:
            self.forwarder.cancel()
        for s in (self.session, self.owner):
            if s:
                await s.close()

    # -- the owner's messages ------------------------------------------------------------------------------------
    def _on_model(self, msg: Model) -> None:
        if msg == self._model_msg:
            return
        self._model_msg = msg
        if self._model_task is not None:
            self._model_task.cancel()
        self._model_task = asyncio.get_running_loop().create_task(self._load_model(msg))

    async def _load_model(self, msg: Model) -> None:
        try:
            await self._load(msg)
        except Exception:  # a front that cannot parse answers 503 (``health``); the reason is logged once here
            log.exception("front %d: cannot take the model state the owner sent", self.front)
            self.model = None

    async def _load(self, msg: Model) -> None:
        if msg.worker_url is None or msg.worker_info is None:
            self.model = None
            return
        info = decode_info(msg.worker_info)
        same_tokenizer = self.model is not None and self._tokenizer_source == (msg.worker_url, info.tokenizer)
        try:
            if same_tokenizer:
                tok = self.model.tokenizer
            elif msg.plain:
                tok = await asyncio.to_thread(PlainWorkers.tokenizer, info)
            else:
                tok = await Discovery(self.session).fetch_tokenizer(msg.worker_url, info)
        except WorkerError as exc:
            log.error("front %d: cannot load the tokenizer of %s: %s", self.front, msg.worker_url, exc.message)
            self.model = None
            return
        if not same_tokenizer:
            freeze_what_loading_made()
        if not msg.memo:
            tok.drop_memo("--no-prefix-memo")
        if msg.inexact_reason is not None and tok.exact:
            tok.mark_inexact(msg.inexact_reason)
        self._tokenizer_source = (msg.worker_url, info.tokenizer)
        self.model = FrontModel(tok, msg.model_name, msg.context_length, msg.page_size,
                                RequestLimits(**msg.limits) if msg.limits else RequestLimits())
        log.info("front %d: model %s, page size %d, tokenizer from %s", self.front, msg.model_name, msg.page_size,
                 msg.worker_url)

    async def _loaded_model(self) -> FrontModel | None:
        """The model once this front has loaded the tokenizer the owner named (None after ``LOAD_WAIT_S``)."""
        deadline = asyncio.get_running_loop().time() + LOAD_WAIT_S
        while self.model is None and self._model_task is not None and not self._model_task.done():
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        return self.model

    def _on_lost(self) -> None:
        log.error("front %d: the placement owner is gone; this front stops", self.front)
        raise_sigterm()

    # -- proxied routes ------------------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        endpoint = request.path
        raw = request.body if type(request) is BareRequest else await read_body(request, self.cfg)
        if type(raw) is not bytes and isinstance(raw, web.Response):  # (an ABC: its isinstance is a call)
            return raw
        rid = request.headers.get("x-request-id") or new_rid()
        model = self.model
        if model is None and self._model_msg is not None and self._model_msg.worker_url is not None:
            model = await self._loaded_model()
        if model is None:
            return error_response(503, "no worker is registered yet; add one with POST /workers or wait for the "
                                  "workers given with --worker-urls to start", kind="unavailable",
                                  headers={"Retry-After": "5"})
        ticket = self.order.ticket()
        try:
            try:
                parsed = await parse(endpoint, raw, tokenizer=model.tokenizer, served_model_name=model.model_name,
                                     context_length=model.context_length, limits=model.limits,
                                     inline_bytes=self.cfg.parse_inline_bytes)
            except RequestError as exc:
                return request_error_response(exc)
            if parsed.stream and type(request) is BareRequest:  # a streamed answer is aiohttp's to write
                raise Handoff
            if not self.order.is_turn(ticket):
                await self.order.wait_turn(ticket)
            attempt = Attempt.of(endpoint, parsed.body, request.headers,
                                 pass_authorization=self.cfg.api_key is None and self.cfg.admin_api_key is None,
                                 input_ids_json=parsed.input_ids_json())
            keys = prompt_keys(parsed, model.page_size)
            placing = self.client.place(rid, [len(p) for p in parsed.prompts], keys, parsed.shared_prefix_len,
                                        parsed.max_new_tokens, attempt.fingerprint)
            self.order.leave(ticket)  # ``place`` wrote its message before this task's first await
            try:
                req, answer = await placing
            except OwnerGone:
                return error_response(503, "the router is stopping", kind="unavailable", headers={"Retry-After": "5"})
        finally:
            self.order.leave(ticket)
        if isinstance(answer, Refused):
            headers = {"Retry-After": answer.retry_after} if answer.retry_after else None
            return error_response(answer.status, answer.message, kind=answer.kind, headers=headers)
        if isinstance(answer, Delegate):
            return await self.to_owner(request, raw)
        placement = FrontPlacement(req, FrontJob(rid), FrontWorker(answer.worker_id, answer.worker_url),
                                   answer.predicted_cached_tokens, answer.queued_s, answer.reason)
        try:
            if parsed.stream:
                return await self.forwarder.stream(request, attempt, placement)
            return await self.forwarder.forward(attempt, placement)
        except WorkerFailure as exc:
            failure = orjson.dumps({"message": str(exc), "connect": exc.connect, "transport": exc.transport,
                                    "timeout": exc.timeout}).decode()
            return await self.to_owner(request, raw, {FAILED_WORKER_HEADER: placement.worker.id,
                                                      FAILURE_HEADER: failure})

    def _release(self, placement: FrontPlacement, *, ok: bool) -> None:
        self.client.release(placement.req, ok, placement.reported_cached_tokens)

    @staticmethod
    def _note_cached(placement: FrontPlacement, reported: int) -> None:
        placement.reported_cached_tokens = reported

    async def health(self, request: web.Request) -> web.StreamResponse:
        """The owner's ``/health``, but 503 while this front is still loading the tokenizer the owner uses."""
        msg = self._model_msg
        if msg is not None and msg.worker_url is not None and self.model is None:
            return error_response(503, f"front {self.front} is loading the tokenizer", kind="unavailable",
                                  headers={"Retry-After": "1"})
        return await self.to_owner(request)

    # -- everything else: the owner's ----------------------------------------------------------------------------
    async def to_owner(self, request: web.Request, body: bytes | None = None,
                       extra: dict[str, str] | None = None) -> web.StreamResponse:
        """Relay ``request`` (``body``: its bytes, when already read) to the owner's HTTP service and its answer
        back, streamed."""
        if body is None:
            raw = await read_body(request, self.cfg)
            if isinstance(raw, web.Response):
                return raw
            body = raw
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        headers.pop(FAILED_WORKER_HEADER, None)  # only a front sets them
        headers.pop(FAILURE_HEADER, None)
        if extra:
            headers.update(extra)
        try:
            async with self.owner.request(request.method, "http://owner" + request.path_qs, data=body,
                                          headers=headers) as resp:
                back = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
                if type(request) is BareRequest:  # answered whole (the bare side serves no streamed answers)
                    return web.Response(status=resp.status, headers=back, body=await resp.read())
                out = web.StreamResponse(status=resp.status, headers=back)
                await out.prepare(request)
                async for chunk in resp.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error_response(503, f"the router's placement owner did not answer: {exc}", kind="unavailable",
                                  headers={"Retry-After": "5"})


def raise_sigterm() -> None:
    """Stop this process as ``SIGTERM`` would (aiohttp's ``run_app`` then closes the app cleanly)."""
    os.kill(os.getpid(), signal.SIGTERM)


ROUTER = web.AppKey("front_router", FrontRouter)


def front_hot_routes(app: web.Application) -> HotRoutes:
    """The proxied routes, for ``http_server.serve`` to answer on bare protocols (``--http-server bare``)."""
    router = app[ROUTER]
    return router_routes(router.cfg, router.handle)


def build_front_app(cfg: RouterConfig, front: int, placement_socket: str, owner_socket: str) -> web.Application:
    router = FrontRouter(cfg, front, placement_socket, owner_socket)
    app = web.Application(client_max_size=cfg.max_body_bytes,
                          middlewares=[json_errors, auth_middleware(cfg), web_answers])
    app[ROUTER] = router
    for path in PROXIED:
        app.router.add_post(path, router.handle)
    app.router.add_get("/health", router.health)
    app.router.add_route("*", "/{tail:.*}", router.to_owner)
    app.on_startup.append(router.start)
    app.on_cleanup.append(router.stop)
    return app
