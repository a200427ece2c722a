"""Who may call which route: client key on inference routes, admin key on the routes that change state.

``--api-key`` guards every inference route; ``--admin-api-key`` guards the worker admin routes (adding and
removing workers, listing them with their URLs and endpoints) and also opens the inference routes. A route
whose key is not configured is open (as SGLang's: an admin key alone leaves inference open). ``/health`` and
``/metrics`` are always open (load balancers and Prometheus scrape them without secrets, as SGLang's own do).
Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Literal

from aiohttp import web

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.errors import error_response

log = logging.getLogger("sgl_moe.router")

Level = Literal["open", "client", "admin"]

OPEN_PATHS = frozenset({"/health", "/metrics"})
ADMIN_PREFIX = "/workers"


def route_level(method: str, path: str) -> Level:
    """The key a route needs: admin for ``/workers`` (any method), nothing for health and metrics, else client."""
    if path in OPEN_PATHS:
        return "open"
    if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
        return "admin"
    return "client"


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, else None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def allowed(level: Level, token: str | None, cfg: RouterConfig) -> bool:
    """Whether ``token`` opens a route of ``level`` under ``cfg``'s keys."""
    if level == "open":
        return True
    admin_ok = cfg.admin_api_key is not None and _same(token, cfg.admin_api_key)
    if level == "admin":
        return cfg.admin_api_key is None or admin_ok
    if cfg.api_key is None:
        return True
    return admin_ok or _same(token, cfg.api_key)


def auth_middleware(cfg: RouterConfig) -> Any:
    """An aiohttp middleware answering 401 (with ``WWW-Authenticate``) when a route's key is missing or wrong."""

    @web.middleware
    async def check_key(request: web.Request, handler: Any) -> web.StreamResponse:
        level = route_level(request.method, request.path)
        if not allowed(level, bearer(request.headers.get("authorization")), cfg):
            log.warning("refused %s %s from %s: %s key missing or wrong", request.method, request.path,
                        request.remote, level)
            what = "an admin key" if level == "admin" else "an API key"
            return error_response(401, f"{request.method} {request.path} needs {what}: send "
                                  "'Authorization: Bearer KEY'", kind="authentication_error",
                                  headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check_key
