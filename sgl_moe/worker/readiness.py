"""The worker's readiness: ``/health`` answers 503 until its start-up work (the Θ profile) is done.

SGLang's own ``/health`` turns 200 once its warm-up request ran; the project's Θ profile starts only then and
sends its own requests for tens of seconds on a CPU, then flushes the prefix cache of its random prompts. A
router or load balancer that took 200 at its word would send traffic into the profile (measuring it as the
worker's capacity) and into a cache about to be flushed. So the launcher puts ``ReadinessGate`` outermost in
SGLang's app. While ``Readiness.ready`` is false:

- ``/health``, ``/health_generate`` and ``/ready`` answer 503 with a JSON body saying what runs, except for the
  start-up work's own probes (``OWN_HEADER`` carrying the gate's token), which reach SGLang's handlers;
- every other request passes; POSTs without the token are counted in ``Readiness.foreign_requests`` (the
  profile then knows it was disturbed).

Once ``open()`` is called the gate costs one attribute read per request.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading

log = logging.getLogger("sgl_moe.readiness")

OWN_HEADER = "x-sgl-moe-startup"
"""Header the start-up work's own requests carry, with ``Readiness.token`` as its value."""
HEALTH_PATHS = frozenset({"/health", "/health_generate", "/ready"})


class Readiness:
    """Whether the worker's start-up work is done, what it is doing meanwhile, and who else sent work."""

    def __init__(self, ready: bool = False, status: str = "starting") -> None:
        self.ready = ready
        self.status = status
        """What the start-up work is doing (the 503 body's ``status``)."""
        self.token = secrets.token_hex(16)
        self.foreign_requests = 0
        """POSTs that arrived while not ready, other than the start-up work's own."""
        self._lock = threading.Lock()

    def say(self, status: str) -> None:
        self.status = status

    def open(self, why: str) -> None:
        """The start-up work is done: ``/health`` reaches SGLang from now on."""
        with self._lock:
            if not self.ready:
                self.ready = True
                self.status = "ready"
                log.info("ready: /health answers from now on (%s)", why)

    def own_headers(self) -> dict[str, str]:
        return {OWN_HEADER: self.token}

    def count_foreign(self) -> None:
        with self._lock:
            self.foreign_requests += 1


class ReadinessGate:
    """ASGI middleware holding the health routes at 503 until ``readiness.ready`` (see the module docstring)."""

    def __init__(self, app, readiness: Readiness) -> None:
        self.app = app
        self.readiness = readiness

    async def __call__(self, scope, receive, send) -> None:
        r = self.readiness
        if r.ready or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        own = any(name == OWN_HEADER.encode() and value == r.token.encode() for name, value in scope["headers"])
        if not own:
            if scope["path"] in HEALTH_PATHS:
                body = json.dumps({"status": "starting", "detail": r.status}).encode()
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()), (b"retry-after", b"5")]})
                await send({"type": "http.response.body", "body": body})
                return
            if scope["method"] == "POST":
                r.count_foreign()
        await self.app(scope, receive, send)
