"""The worker's readiness gate (``/health`` 503 until the start-up work ends) and the host-load reading the Θ
profile uses to tell whether it measured the worker alone. The gate is driven as SGLang's app drives it (an
ASGI call); the host load reads this machine's real ``/proc/stat`` with a real busy child process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from sgl_moe.worker.host_load import HostLoad
from sgl_moe.worker.readiness import OWN_HEADER, Readiness, ReadinessGate


def _call(gate: ReadinessGate, path: str, method: str = "GET", headers=()) -> tuple[int, bytes, list[str]]:
    """One HTTP request through the gate; returns (status, body, paths the inner app saw)."""
    seen: list[str] = []

    async def inner(scope, receive, send):
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"inner"})

    gate.app = inner
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method,
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(gate(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), seen


def test_health_is_503_with_what_runs_until_the_start_up_work_opens_it():
    readiness = Readiness()
    gate = ReadinessGate(None, readiness)
    readiness.say("Θ throughput profile: attempt 1 of 3")
    for path in ("/health", "/health_generate", "/ready"):
        status, body, seen = _call(gate, path)
        assert status == 503 and not seen
        assert json.loads(body) == {"status": "starting", "detail": "Θ throughput profile: attempt 1 of 3"}
    # The start-up work's own probe reaches SGLang's handler.
    status, _, seen = _call(gate, "/health", headers=[(OWN_HEADER, readiness.token)])
    assert status == 200 and seen == ["/health"]
    # A wrong token is anyone else.
    assert _call(gate, "/health", headers=[(OWN_HEADER, "guess")])[0] == 503
    readiness.open("profile done")
    assert readiness.ready and _call(gate, "/health") == (200, b"inner", ["/health"])


def test_work_sent_before_ready_passes_and_is_counted_as_foreign():
    readiness = Readiness()
    gate = ReadinessGate(None, readiness)
    assert _call(gate, "/generate", "POST")[0] == 200
    assert _call(gate, "/sgl_moe/info")[0] == 200  # reads are not work
    assert _call(gate, "/generate", "POST", headers=[(OWN_HEADER, readiness.token)])[0] == 200
    assert readiness.foreign_requests == 1
    readiness.open("done")
    _call(gate, "/generate", "POST")
    assert readiness.foreign_requests == 1  # not counted once ready


@pytest.mark.skipif(not HostLoad().available, reason="needs Linux /proc/stat")
def test_host_load_counts_other_processes_cpu_not_its_own():
    host = HostLoad()
    # This process busy for a second: its own, not foreign.
    start = host.sample()
    end_at = time.monotonic() + 1.0
    while time.monotonic() < end_at:
        pass
    own_busy = host.foreign_cores(start, host.sample())
    # A child of another process tree busy for a second: foreign. (A child of this process would count as
    # this worker's own, like SGLang's scheduler, so the spinner runs under a separate root.)
    host_other = HostLoad(root_pid=1 << 22)  # no such process: every CPU second on the host is foreign to it
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()+1.5\nwhile time.time()<t: pass"])
    try:
        time.sleep(0.2)
        start = host.sample(), host_other.sample()
        time.sleep(1.0)
        end = host.sample(), host_other.sample()
    finally:
        spinner.wait(10)
    with_child = host.foreign_cores(start[0], end[0])  # the spinner is this process's child: own
    everything = host_other.foreign_cores(start[1], end[1])
    # The busy loop in this process and its busy child are not foreign; the same second seen from outside the
    # tree is (at least most of one core; another test process may add to it, never take from it).
    assert everything >= 0.6
    assert everything - with_child >= 0.5
    assert own_busy <= everything + 0.5
