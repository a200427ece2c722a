"""Taking a request in: its body within the size and time limits, and what of it goes on to the worker.

A body over ``--max-body-bytes`` is answered 413 before it is read when ``Content-Length`` says so, and as soon
as the bytes read pass the limit otherwise (aiohttp's ``client_max_size``, set from the same flag); a body that
has not arrived in full within ``--body-timeout-s`` is answered 408. The request head is bounded by aiohttp's
keep-alive timer, which ``run_app`` sets to ``--header-timeout-s``: a connection that has not completed a
request head that long after it opened (or after its previous response) is closed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.errors import error_response


@dataclass(frozen=True)
class Attempt:
    """What the router sends a worker for one client request (the same on a retry)."""

    endpoint: str
    body: bytes
    headers: dict[str, str]
    fingerprint: bytes
    """``SuspectList.fingerprint`` of the route and body without any ``rid``."""
    abort_rid: str | None
    """The SGLang ``rid`` to abort on the worker if the client goes away (None: a batch, or no ``rid`` field;
    the worker then notices the closed connection itself)."""


async def read_body(request: web.Request, cfg: RouterConfig) -> bytes | web.Response:
    """The body, or the 413/408 answer when it breaks the limits."""
    length = request.content_length
    if length is not None and length > cfg.max_body_bytes:
        return too_large(length, cfg)
    try:
        async with asyncio.timeout(cfg.body_timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return too_large(None, cfg)
    except TimeoutError:
        return closing(error_response(408, f"the request body did not arrive within {cfg.body_timeout_s:g} s "
                                           "(--body-timeout-s)"))


def too_large(length: int | None, cfg: RouterConfig) -> web.Response:
    size = f"{length} bytes" if length is not None else "larger"
    return closing(error_response(413, f"request body too large ({size}); the router accepts at most "
                                       f"{cfg.max_body_bytes} bytes (--max-body-bytes)"))


def closing(resp: web.Response) -> web.Response:
    """``resp``, after which the connection closes (the rest of an unread body is not waited for)."""
    resp.force_close()
    return resp


def worker_auth_headers(cfg: RouterConfig) -> dict[str, str]:
    """Headers on every request the router sends its workers: its client key, for workers started with SGLang's
    ``--api-key`` set to it."""
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def single_prompt(endpoint: str, body: dict[str, Any]) -> bool:
    """The body asks for one generation (SGLang then takes a string ``rid``; a batch needs one per prompt)."""
    if endpoint == "/v1/chat/completions":
        return True
    if endpoint == "/v1/completions":
        prompt = body.get("prompt")
        return isinstance(prompt, str) or (isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int))
    if endpoint == "/generate":
        for key in ("input_ids", "text", "input_embeds"):
            value = body.get(key)
            if value is None:
                continue
            if key == "text":
                return isinstance(value, str)
            if key == "input_ids":
                return bool(value) and isinstance(value[0], int)
            return bool(value) and isinstance(value[0], list) and bool(value[0]) and not isinstance(value[0][0], list)
    return False
