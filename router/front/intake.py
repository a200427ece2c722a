"""Taking a request in: its body within the size and time limits, then parsed (on the event loop, or in a
thread when it is large).

A body over ``--max-body-bytes`` is answered 413 before it is read when ``Content-Length`` says so, and as soon
as the bytes read pass the limit otherwise (aiohttp's ``client_max_size``, set from the same flag); a body that
has not arrived in full within ``--body-timeout-s`` is answered 408. The request head is bounded by aiohttp's
keep-alive timer, which ``run_app`` sets to ``--header-timeout-s``: a connection that has not completed a
request head that long after it opened (or after its previous response) is closed.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.errors import error_response
from sgl_moe.router.request.parsed_request import ParsedRequest
from sgl_moe.router.request.request_limits import RequestLimits
from sgl_moe.router.request.request_parsing import parse_request
from sgl_moe.router.request.router_tokenizer import RouterTokenizer


async def read_body(request: web.Request, cfg: RouterConfig) -> bytes | web.Response:
    """The body, or the 413/408 answer when it breaks the limits."""
    length = request.content_length
    if length is not None and length > cfg.max_body_bytes:
        return too_large(length, cfg)
    try:
        if request.content.is_eof():  # the whole body came with the head: nothing to wait for, no timer to set
            return await request.read()
        async with asyncio.timeout(cfg.body_timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return too_large(None, cfg)
    except TimeoutError:
        return too_slow(cfg)


async def parse(endpoint: str, raw: bytes, *, tokenizer: RouterTokenizer, served_model_name: str,
                context_length: int, limits: RequestLimits, inline_bytes: int) -> ParsedRequest:
    """``parse_request`` of the body: inline when it is at most ``inline_bytes`` (``--parse-inline-bytes``), else
    in a thread (the tokenizers library releases the GIL), so a large body does not hold the event loop. Raises
    RequestError."""
    if len(raw) <= inline_bytes:
        return parse_request(endpoint, raw, tokenizer=tokenizer, served_model_name=served_model_name,
                             context_length=context_length, limits=limits)
    return await asyncio.to_thread(parse_request, endpoint, raw, tokenizer=tokenizer,
                                   served_model_name=served_model_name, context_length=context_length, limits=limits)


def too_large(length: int | None, cfg: RouterConfig) -> web.Response:
    size = f"{length} bytes" if length is not None else "larger"
    return closing(error_response(413, f"request body too large ({size}); the router accepts at most "
                                       f"{cfg.max_body_bytes} bytes (--max-body-bytes)"))


def too_slow(cfg: RouterConfig) -> web.Response:
    return closing(error_response(408, f"the request body did not arrive within {cfg.body_timeout_s:g} s "
                                       "(--body-timeout-s)"))


def closing(resp: web.Response) -> web.Response:
    """``resp``, after which the connection closes (the rest of an unread body is not waited for)."""
    resp.force_close()
    return resp
