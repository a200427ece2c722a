"""Locust users for ``benchmarks/replicas_soak.py``: closed loop, each user on one router replica (user ``i`` on
replica ``i mod N``), a failed request (no answer, or 5xx) resent once to the next replica, which the user then
keeps. Statistics rows: ``generate`` (first tries) and ``generate retry`` (the resends: a failure there is a request
lost). Every failure is also written, with its time, to ``$SOAK_EVENTS`` (one JSON object per line).

Environment: ``SOAK_REPLICAS`` (comma-separated router URLs), ``SOAK_BODIES`` (a file of request bodies, one JSON
object per line, sent in turn), ``SOAK_EVENTS``.
"""

from __future__ import annotations

import itertools
import json
import os
import time

from locust import FastHttpUser, constant, task

REPLICAS = [u for u in os.environ.get("SOAK_REPLICAS", "").split(",") if u]
with open(os.environ.get("SOAK_BODIES", os.devnull), "rb") as f:
    BODIES = [line.rstrip(b"\n") for line in f if line.strip()]
_next_body = itertools.cycle(range(max(1, len(BODIES))))
_next_user = itertools.count()
_events = open(os.environ.get("SOAK_EVENTS", os.devnull), "a", buffering=1)  # noqa: SIM115 (the process's life)


def _note(kind: str, url: str, status: int, detail: str) -> None:
    _events.write(json.dumps({"t": time.time(), "kind": kind, "url": url, "status": status,
                              "detail": detail[:200]}) + "\n")


class ReplicaUser(FastHttpUser):
    wait_time = constant(0)
    host = REPLICAS[0] if REPLICAS else "http://127.0.0.1"
    network_timeout = 120.0
    connection_timeout = 5.0

    def on_start(self) -> None:
        self.at = next(_next_user) % max(1, len(REPLICAS))

    @task
    def generate(self) -> None:
        body = BODIES[next(_next_body)]
        for attempt in (0, 1):
            url = f"{REPLICAS[self.at]}/generate"
            name = "generate" if attempt == 0 else "generate retry"
            with self.client.post(url, data=body, headers={"content-type": "application/json"}, name=name,
                                  catch_response=True) as resp:
                if resp.status_code == 200:
                    resp.success()
                    return
                detail = (resp.text or str(resp.error or ""))[:200]
                resp.failure(f"{resp.status_code}: {detail}")
                _note("lost" if attempt else "first_try", url, resp.status_code or 0, detail)
            if resp.status_code and 200 <= resp.status_code < 500:
                return  # a 4xx is the request's own fault: not resent
            self.at = (self.at + 1) % len(REPLICAS)
