"""The router's one JSON error shape, and the router-side exceptions that become it.

Every error the router itself answers, on every route, has the body
``{"error": {"message": str, "type": ErrorKind, "param": str | None, "code": status}}`` (OpenAI's
shape, with the HTTP status repeated as ``code``), so a client reads one shape whether the router
refused the request or a worker failed. Worker answers below 500 are not errors of the router: they
reach the client byte for byte.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import orjson
from aiohttp import web

log = logging.getLogger("sgl_moe.router")

ErrorKind = Literal["invalid_request_error", "not_found_error", "rate_limit_exceeded", "unavailable",
                    "worker_failure", "not_supported", "request_failed", "internal_error", "authentication_error"]
"""The ``type`` field of an error body."""


class RequestError(Exception):
    """Bad client input: answered with ``status`` (4xx); never counts as a worker failure."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def kind(self) -> ErrorKind:
        return "not_found_error" if self.status == 404 else "invalid_request_error"


class WorkerFailure(Exception):
    """The worker did not produce a usable answer (transport error or 5xx)."""

    def __init__(self, message: str, transport: bool, *, connect: bool = False, timeout: bool = False) -> None:
        super().__init__(message)
        self.transport = transport
        """Unreachable or the connection broke, not merely failing: the worker is marked unhealthy."""
        self.connect = connect
        """The connection could not be made: nothing of the request reached the worker."""
        self.timeout = timeout
        """The worker did not answer within ``--request-timeout-s``."""


def error_body(status: int, message: str, *, kind: ErrorKind = "invalid_request_error",
               param: str | None = None) -> dict[str, Any]:
    """The ``error`` object; key order is part of the bytes clients see, so it is fixed here."""
    return {"message": message, "type": kind, "param": param, "code": status}


def error_response(status: int, message: str, *, kind: ErrorKind = "invalid_request_error",
                   param: str | None = None, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error answer in the router's one shape."""
    body = {"error": error_body(status, message, kind=kind, param=param)}
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


def request_error_response(exc: RequestError) -> web.Response:
    """The answer to bad client input."""
    return error_response(exc.status, exc.message, kind=exc.kind, param=exc.param)


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown paths and methods, and any exception a handler lets escape (a router bug: logged with its
    traceback), get JSON errors like every other router answer."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(404, f"{request.method} {request.path} is not served by the router",
                              kind="not_found_error")
    except web.HTTPMethodNotAllowed as exc:
        return error_response(405, f"{request.method} is not allowed on {request.path} "
                                   f"(allowed: {', '.join(sorted(exc.allowed_methods))})")
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(413, f"request body too large: {exc.text}")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.text or exc.reason,
                              kind="not_found_error" if exc.status == 404 else "invalid_request_error")
    except Exception as exc:
        if request.writer.output_size > 0:  # part of a response is out: aiohttp closes the connection
            raise
        log.exception("%s %s failed inside the router", request.method, request.path)
        return error_response(500, f"internal router error: {type(exc).__name__}: {exc}", kind="internal_error")
