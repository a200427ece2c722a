"""A stand-in for the router's ``POST /v1/classify`` and ``POST /generate``, for testing clients in-process.

It answers contract A's shapes with the router's own task parsing and result assembly
(``sgl_moe.router.front.prefill_tasks``), but scores every unit with a hash instead of a model, so a client
(the classify CLI, the locustfile) can be tested without SGLang workers. Faults are injected by knobs
(``FakeRouterKnobs``) and every request it saw is recorded, so tests can check what a client sent.
It runs on its own event loop in a background thread and listens on a real loopback port, because
the clients under test may be subprocesses.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from sgl_moe.router.errors import error_response
from sgl_moe.router.front.prefill_tasks import TaskError, combine, parse_tasks

FAIL_MARKER = "FAIL"
"""A task whose prompt contains this string gets an error result (HTTP 200, contract A's run-time failure)."""


@dataclass
class FakeRouterKnobs:
    """Fault injection; mutable while the server runs (tests flip knobs between phases)."""

    delay_s: float = 0.0
    """Sleep this long before answering each POST."""
    busy_first: int = 0
    """Answer the first N POSTs 429 with ``Retry-After: retry_after`` (the router's 'busy')."""
    retry_after: str = "1"
    """The Retry-After header value sent with 429."""
    fail_every: int = 0
    """Every Nth task (classify) or request (generate) seen fails at run time: an error result, or 500 for
    ``/generate``. 0: never."""


@dataclass
class Seen:
    """What the fake received: one entry per POST."""

    path: str
    body: Any
    status: int
    at: float
    """time.monotonic() when answered."""


def _unit_answer(text: str, labels: list[str]) -> tuple[list[float], list[float]]:
    """Deterministic fake log-probabilities for one unit, normalised over its labels."""
    lps = []
    for label in labels:
        h = hashlib.blake2b(f"{text}\x00{label}".encode(), digest_size=4).digest()
        lps.append(-0.05 - int.from_bytes(h, "big") / 2**32 * 8.0)
    top = max(lps)
    w = [math.exp(lp - top) for lp in lps]
    return [x / sum(w) for x in w], lps


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> web.Response:
    return error_response(status, message, kind=kind, param=param)  # type: ignore[arg-type]


@dataclass
class FakeRouter:
    """``with FakeRouter() as fake: fake.url`` serves until the block ends."""

    knobs: FakeRouterKnobs = field(default_factory=FakeRouterKnobs)
    seen: list[Seen] = field(default_factory=list)
    injected: int = 0
    """Failures injected so far (error results, 429s and 500s)."""
    url: str = ""
    _posts: int = 0
    _units: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    # -- request handling (runs on the server's loop) -------------------------------------------

    def _count_post(self) -> tuple[int, bool]:
        with self._lock:
            self._posts += 1
            busy = self._posts <= self.knobs.busy_first
            if busy:
                self.injected += 1
            return self._posts, busy

    def _inject(self) -> bool:
        """Count one task/request; true if this one is chosen to fail."""
        with self._lock:
            self._units += 1
            hit = self.knobs.fail_every > 0 and self._units % self.knobs.fail_every == 0
            if hit:
                self.injected += 1
            return hit

    def _record(self, path: str, body: Any, resp: web.Response) -> web.Response:
        with self._lock:
            self.seen.append(Seen(path, body, resp.status, time.monotonic()))
        return resp

    async def _classify(self, request: web.Request) -> web.Response:
        raw = await request.read()
        _, busy = self._count_post()
        if self.knobs.delay_s:
            await asyncio.sleep(self.knobs.delay_s)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._record("/v1/classify", None, _error(400, f"the request body is not valid JSON: {exc}"))
        if busy:
            resp = _error(429, "router busy: queue full; retry later", kind="rate_limit_exceeded")
            resp.headers["Retry-After"] = self.knobs.retry_after
            return self._record("/v1/classify", body, resp)
        try:
            tasks, model, _ = parse_tasks(body)
        except TaskError as exc:
            return self._record("/v1/classify", body, _error(400, exc.message, exc.param))
        results, statuses, units = [], [], 0
        for task in tasks:
            text = task.prompt if task.prompt is not None else orjson.dumps(task.input_ids or task.messages).decode()
            marked = FAIL_MARKER in text
            if marked:
                with self._lock:
                    self.injected += 1
            if marked or self._inject():
                results.append({"id": task.id, "type": task.type,
                                "error": {"message": "injected failure: worker returned 502", "code": 502}})
                statuses.append(502)
                continue
            answers = [_unit_answer(text + u.suffix, u.labels) for u in task.units()]
            units += len(answers)
            results.append(combine(task, answers))
            statuses.append(200)
        out: dict[str, Any] = {"object": "classify", "model": model or "fake", "results": results,
                               "usage": {"prompt_tokens": 0, "score_requests": units}}
        status = 200 if 200 in statuses else statuses[0]
        if status != 200:  # like the router: every task failed, so the call fails with the first status
            out["error"] = {"message": results[0]["error"]["message"], "type": "request_failed", "param": None,
                            "code": status}
        return self._record("/v1/classify", body, _json(status, out))

    async def _generate(self, request: web.Request) -> web.Response:
        raw = await request.read()
        _, busy = self._count_post()
        if self.knobs.delay_s:
            await asyncio.sleep(self.knobs.delay_s)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._record("/generate", None, _error(400, f"the request body is not valid JSON: {exc}"))
        if busy:
            resp = _error(429, "router busy", kind="rate_limit_exceeded")
            resp.headers["Retry-After"] = self.knobs.retry_after
            return self._record("/generate", body, resp)
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            return self._record("/generate", body, _error(400, "text must be a string", "text"))
        if self._inject():
            return self._record("/generate", body, _error(500, "injected failure", kind="internal_error"))
        out = {"text": "x", "meta_info": {"prompt_tokens": len(body["text"]) // 4, "completion_tokens": 1,
                                          "cached_tokens": 0, "finish_reason": {"type": "length", "length": 1}}}
        return self._record("/generate", body, _json(200, out))

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # -- lifecycle (called from the test's thread) -----------------------------------------------

    def start(self) -> FakeRouter:
        ready = threading.Event()
        errors: list[BaseException] = []

        async def serve() -> None:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/v1/classify", self._classify)
            app.router.add_post("/generate", self._generate)
            app.router.add_get("/health", self._health)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(serve())
            except BaseException as exc:  # surfaced to start()'s caller
                errors.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())  # type: ignore[union-attr]
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-router", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    def __enter__(self) -> FakeRouter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def classify_bodies(self) -> list[Any]:
        with self._lock:
            return [s.body for s in self.seen if s.path == "/v1/classify"]
