"""A worker's answer relayed whole: its status and body, the content type, the router's ``x-sgl-moe-*`` headers.

``Forwarder.forward`` returns one for every forwarded request that is not streamed. The bare server writes it as
HTTP/1.1 bytes at once (``http_server.encode_response``); aiohttp's server, which serves every other request, gets
the same answer as a ``web.Response`` (``web_answers``, a middleware). Making aiohttp's ``Response`` cost about
1.2 us a request and writing its headers out of their ``CIMultiDict`` another 1.7 us (2-core VM, ``timeit``), with 8
interpreted calls.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web


class Answer:
    """What ``web.Response(body=body, status=status, headers=headers)`` would hold, without making one."""

    __slots__ = ("status", "body", "headers")
    keep_alive = None
    """As ``web.Response.keep_alive`` when nothing forced it: the connection's own rule decides."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        """Names in lower case, as the router writes them."""

    def web(self) -> web.Response:
        return web.Response(body=self.body, status=self.status, headers=self.headers)


@web.middleware
async def web_answers(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's server takes a handler's ``Answer`` as its ``web.Response``."""
    resp = await handler(request)
    return resp.web() if type(resp) is Answer else resp
