"""Forwarding a placed request to its worker and relaying the answer to the client.

Responses from workers reach the client byte for byte (status, body, content type); the router adds only
``x-sgl-moe-*`` headers saying where the request went and what it predicted. A client that goes away has its
request aborted on the worker; the worker's reported cached tokens are compared with the prediction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import aiohttp
import orjson
from aiohttp import web

from sgl_moe.router.errors import WorkerFailure
from sgl_moe.router.front.answer import Answer
from sgl_moe.router.front.attempt import Attempt
from sgl_moe.router.front.worker_client import WorkerClient
from sgl_moe.router.placement.job import Placement

log = logging.getLogger("sgl_moe.router")

ABORT_PATH = "/abort_request"
"""SGLang's route that aborts a request by ``rid``."""


def note_cached(placement: Placement, reported: int) -> None:
    """Count the predicted prefix hit next to what the worker reported, on the placement's worker."""
    c = placement.worker.counters
    c.predicted_cached_tokens += placement.predicted_cached_tokens
    c.reported_cached_tokens += reported
    if reported != placement.predicted_cached_tokens and log.isEnabledFor(logging.DEBUG):
        log.debug("request %s on %s: predicted %d cached tokens, the worker reported %d (%s)",
                  placement.job.rid, placement.worker.id, placement.predicted_cached_tokens, reported,
                  placement.reason.split(";")[0])


class Release(Protocol):
    """``Scheduler.release``: give back a placement's reservation and settle its promised blocks (``ok``: the
    request succeeded, so they are stored on its worker)."""

    def __call__(self, placement: Placement, *, ok: bool) -> None: ...


class Forwarder:
    """Sends placed requests to their workers and relays the answers: ``forward`` (a published hook) and
    ``stream`` each release the placement whatever happens; a request whose client went away is aborted on its
    worker (``aborts``), by a task of its own that releases the placement when the abort is done."""

    def __init__(self, client: WorkerClient, session: aiohttp.ClientSession, release: Release,
                 abort_timeout_s: float, note_cached: Callable[[Placement, int], None] = note_cached) -> None:
        self.client = client
        """Carries the forwarded requests (``worker_client``)."""
        self.session = session
        """The router's aiohttp client to the workers: aborts."""
        self.release = release
        self.note_cached = note_cached
        """What to do with the cached tokens a worker reported for a placement (default: ``note_cached``)."""
        self.abort_timeout_s = abort_timeout_s
        """``--abort-timeout-s``: how long an abort may take before the request is counted as lost."""
        self.aborts = 0
        """Requests aborted on their worker because the client went away."""
        self.abort_failures = 0
        """Of those, aborts the worker did not accept within ``--abort-timeout-s`` (counted as lost)."""
        self._tasks: list[asyncio.Task] = []
        """Aborts under way."""

    def cancel(self) -> None:
        """The router stops: cancel the aborts under way (each still releases its placement) and close the idle
        connections to workers."""
        for task in self._tasks:
            task.cancel()
        self.client.close()

    def _headers(self, placement: Placement) -> dict[str, str]:
        return {"x-sgl-moe-worker": placement.worker.id, "x-sgl-moe-request-id": placement.job.rid,
                "x-sgl-moe-predicted-cached-tokens": str(placement.predicted_cached_tokens),
                "x-sgl-moe-queue-ms": f"{placement.queued_s * 1e3:.1f}"}

    async def forward(self, attempt: Attempt, placement: Placement) -> Answer:
        """POST ``attempt`` to the placed worker; answer with its status and body byte for byte, plus our headers.

        Hook: for use as ``Router.run``'s ``call`` (``classify_route`` uses it). It releases ``placement`` whatever
        happens (the client leaving too: the request is then aborted on the worker), and raises WorkerFailure
        (which ``run`` answers or retries) when the worker gives no usable answer.
        """
        worker = placement.worker
        ok = aborting = False
        try:
            status, headers, payload = await self.client.fetch(worker.url + attempt.endpoint, attempt.body,
                                                               attempt.headers)
            ctype = headers.get("content-type", "application/json")
            worker.last_progress = time.monotonic()
            if status >= 500:
                raise WorkerFailure(f"answered {status}: {payload[:300].decode(errors='replace')}", transport=False)
            ok = status < 400
            if ok:
                self._note_cached(placement, attempt.endpoint, payload)
            return Answer(status, payload, {"content-type": ctype, **self._headers(placement)})
        except asyncio.CancelledError:
            aborting = self._abort(attempt, placement)
            raise
        finally:
            if not aborting:
                self.release(placement, ok=ok)

    async def stream(self, request: web.Request, attempt: Attempt, placement: Placement) -> web.StreamResponse:
        """Relay the placed worker's streamed answer to ``request``'s client chunk by chunk (``forward``'s
        streaming twin: it releases ``placement`` whatever happens)."""
        worker = placement.worker
        ok = aborting = False
        try:
            async with self.client.post(worker.url + attempt.endpoint, attempt.body, attempt.headers) as resp:
                if resp.status >= 500:
                    text = (await resp.read())[:300].decode(errors="replace")
                    raise WorkerFailure(f"answered {resp.status}: {text}", transport=False)
                out = web.StreamResponse(status=resp.status, headers={
                    "content-type": resp.headers.get("content-type", "text/event-stream"), **self._headers(placement)})
                await out.prepare(request)
                try:
                    async for chunk in resp.chunks():
                        await out.write(chunk)
                except WorkerFailure as exc:
                    log.warning("stream of %s from %s broke: %s", placement.job.rid, worker.id, exc)
                    return out
                except ConnectionResetError:  # the client went away mid-stream
                    aborting = self._abort(attempt, placement)
                    return out
                await out.write_eof()
                ok = resp.status < 400
                return out
        except asyncio.CancelledError:
            aborting = self._abort(attempt, placement)
            raise
        finally:
            if not aborting:
                self.release(placement, ok=ok)

    def _abort(self, attempt: Attempt | None, placement: Placement) -> bool:
        """The client went away: abort its request on the worker. True when an abort task now owns releasing
        ``placement`` (it does so whatever the abort's outcome, within ``--abort-timeout-s``); False when there is
        no ``rid`` to abort (the worker notices the closed connection) and the caller releases it."""
        self.aborts += 1
        worker, rid = placement.worker, placement.job.rid
        abort_rid = attempt.abort_rid if attempt is not None else None
        log.info("client of request %s went away: %s", rid,
                 f"aborting {abort_rid} on worker {worker.id}" if abort_rid else
                 f"closed the connection to worker {worker.id}, which aborts it there")
        if abort_rid is None:
            return False
        task = asyncio.get_running_loop().create_task(self._abort_then_release(placement, abort_rid))
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)
        return True

    async def _abort_then_release(self, placement: Placement, abort_rid: str) -> None:
        worker = placement.worker
        t0 = time.monotonic()
        try:
            why = await abort_on_worker(self.session, worker.url, abort_rid, self.abort_timeout_s)
            if why is not None:
                self.abort_failures += 1
                log.warning("abort of %s on worker %s failed after %.1f s: %s; the request is counted as lost and "
                            "its load on the worker released", abort_rid, worker.id, time.monotonic() - t0, why)
        finally:
            self.release(placement, ok=False)

    def _note_cached(self, placement: Placement, endpoint: str, payload: bytes) -> None:
        """Compare the predicted prefix hit with what the worker reports (``meta_info.cached_tokens``)."""
        reported = reported_cached_tokens(endpoint, payload)
        if reported is not None:
            self.note_cached(placement, reported)


CACHED_KEY = b'"cached_tokens":'
"""The key as SGLang's JSON writes it. Inside a JSON string every ``"`` is escaped, so these bytes (the quote after
``s`` unescaped, then a colon) occur only as a key."""
_AFTER_NUMBER = (b",", b"}", b" ", b"\n", b"\r", b"\t")


def reported_cached_tokens(endpoint: str, payload: bytes) -> int | None:
    """The cached tokens a worker's answer reports (``/generate``: the sum of its items' ``meta_info.cached_tokens``;
    the OpenAI routes: ``usage.prompt_tokens_details.cached_tokens``), or None when it reports none.

    An answer that is one object holding the key once, as SGLang writes it (in ``meta_info`` or ``usage``), is read at
    the key without parsing the rest: a scoring request's answer can carry a log-probability per prompt token
    (hundreds of kB at 4,000 tokens), all parsed before for this one integer. Anything else (a batch, the key twice,
    a value that is not a plain integer) is parsed whole, as before (``reported_cached_tokens_parsed``); the tests
    hold the two readings equal on SGLang's answers and on answers shaped to trip the scan."""
    if endpoint not in ("/generate", "/v1/completions", "/v1/chat/completions"):
        return None
    at = payload.find(CACHED_KEY)
    if at < 0 and payload[:1] == b"{":
        return None  # no such key anywhere in the one object
    if at >= 0 and payload[:1] == b"{" and payload.find(CACHED_KEY, at + 1) < 0:
        start = at + len(CACHED_KEY)
        while payload[start:start + 1] == b" ":
            start += 1
        end = start
        while payload[end:end + 1].isdigit():
            end += 1
        digits = payload[start:end]
        if digits and payload[end:end + 1] in _AFTER_NUMBER and (digits[:1] != b"0" or len(digits) == 1):
            return int(digits)
    return reported_cached_tokens_parsed(endpoint, payload)


def reported_cached_tokens_parsed(endpoint: str, payload: bytes) -> int | None:
    """``reported_cached_tokens`` by parsing the whole answer."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if endpoint == "/generate":
        items = data if isinstance(data, list) else [data]
        vals = [_get(i, "meta_info", "cached_tokens") for i in items]
        return sum(vals) if vals and all(isinstance(v, int) for v in vals) else None
    cached = _get(data, "usage", "prompt_tokens_details", "cached_tokens")
    return cached if isinstance(cached, int) else None


def _get(data: object, *keys: str) -> object:
    """``data[k1][k2]...``, or None where a level is missing or not an object."""
    for k in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(k)
    return data


async def abort_on_worker(session: aiohttp.ClientSession, base_url: str, rid: str, timeout_s: float) -> str | None:
    """Ask the worker to abort request ``rid``, waiting at most ``timeout_s``. None: the worker accepted, or its
    process is gone (a refused connection: the request went with it). Otherwise why the abort did not get through
    (``repr`` of the error, never empty): the worker may still be running the request."""
    try:
        async with session.post(base_url + ABORT_PATH, json={"rid": rid},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return None if resp.status == 200 else f"answered {resp.status}"
    except aiohttp.ClientConnectorError:
        return None
    except (TimeoutError, aiohttp.ClientError) as exc:
        return repr(exc)
