"""``WorkerProcess.wait_ready``: it waits as long as the worker itself may take (a Θ profile on a busy host waits for
a quiet one, up to ``--moe-calibration-timeout-s``), and its progress says what the worker says it is doing. The
demo once gave up at 300 s while its workers' profiles, disturbed by another program, still had minutes to go.

The "worker" here is a bare HTTP server answering as a starting worker's ``ReadinessGate`` does: 503 with a
``detail`` for a few polls, then ready. It stands in for the worker's HTTP face only; the process whose exit
``wait_ready`` watches is a real child process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sgl_moe.harness.worker_process import (
    START_ALLOWANCE_S,
    WorkerProcess,
    WorkerStartError,
    printed_progress,
    ready_timeout_s,
)
from sgl_moe.worker.args import MoeArgs

WAITING = "Θ throughput profile: attempt 1 of 3 waits up to 120 s for a quiet host"


class _Starting(BaseHTTPRequestHandler):
    """503 with ``WAITING`` for the first ``busy_polls`` health checks, then 200 and a profiled Θ."""

    busy_polls = 4
    polls = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/health":
            type(self).polls += 1
            if type(self).polls <= self.busy_polls:
                self._send(503, {"status": "starting", "detail": WAITING})
            else:
                self._send(200, {})
        elif self.path == "/sgl_moe/info":
            self._send(200, {"saturation": {"state": "profiled", "flops": 1e12}})
        else:
            self._send(404, {})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def starting_worker(tmp_path):
    _Starting.polls = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Starting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    w = WorkerProcess(log_path=tmp_path / "w.log", port=server.server_address[1])
    w.proc, w.started_at = proc, 0.0
    try:
        yield w
    finally:
        proc.kill()
        proc.wait()
        server.shutdown()


def test_progress_says_what_the_starting_worker_says(starting_worker, capsys):
    said: list[str] = []
    info = starting_worker.wait_ready(timeout=30, progress=lambda s, status: said.append(status), note_every_s=0)
    assert info["saturation"]["state"] == "profiled"
    assert WAITING in said
    printed_progress("... still starting")(42.4, WAITING)
    assert capsys.readouterr().out == f"  ... still starting (42 s): {WAITING}\n"


def test_a_timeout_names_the_last_thing_the_worker_said(starting_worker):
    _Starting.busy_polls = 10_000
    try:
        with pytest.raises(WorkerStartError, match="last said: Θ throughput profile: attempt 1 of 3 waits"):
            starting_worker.wait_ready(timeout=2)
    finally:
        _Starting.busy_polls = 4


def test_the_default_wait_covers_the_workers_own_calibration_timeout():
    assert ready_timeout_s([]) == START_ALLOWANCE_S + MoeArgs().calibration_timeout_s
    assert ready_timeout_s(["--moe-calibration-timeout-s", "60"]) == START_ALLOWANCE_S + 60
    assert ready_timeout_s(["--moe-calibration-timeout-s=90", "--other"]) == START_ALLOWANCE_S + 90
