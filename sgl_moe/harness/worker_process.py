"""A worker started as a child process (``python -m sgl_moe.launch_server``): start, wait, stop.

Used by the demo, the test fixtures and the benchmarks, so a worker is always started the same way.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from sgl_moe.wire import KV_EVENTS_PORT_OFFSET, NCCL_PORT_OFFSET, REPLAY_PORT_OFFSET
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.preflight import port_free


class WorkerStartError(RuntimeError):
    """The worker exited or did not become ready; the message carries the end of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


WORKER_PORTS = range(20000, 28000)
"""Where ``free_worker_port`` looks: below Linux's ephemeral range (32768-60999), so no outgoing connection holds
the port or its KV-event ports when the worker binds them."""
EVENT_PORT_OFFSETS = tuple(base + rank for base in (KV_EVENTS_PORT_OFFSET, REPLAY_PORT_OFFSET) for rank in range(4))
"""``launch_server`` publishes KV events on the worker's port + 1000 and replays on + 2000, plus the DP rank
(up to 4 ranks checked)."""
DERIVED_PORT_OFFSETS = (*EVENT_PORT_OFFSETS, NCCL_PORT_OFFSET)
"""Every port ``launch_server`` binds besides the worker's own: the KV-event ports and the distributed rendezvous
(port - 1000, bound on every interface)."""

_handed_out: set[int] = set()
"""Ports this process has handed to a worker, with their derived ports: a worker still starting has bound none of
them yet, so the next pick must not take one."""


def free_worker_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port for a worker whose derived ports (``DERIVED_PORT_OFFSETS``) are free too, none of them handed to
    another worker of this process.

    ``free_port`` alone took an ephemeral port, and its + 1000 was sometimes another worker's, or a client
    connection's (CI: "KV-event port(s) 43589 ... are in use" failed a fixture's start-up)."""
    rng = random.Random()
    for _ in range(attempts):
        port = rng.choice(WORKER_PORTS)
        ports = {port + off for off in (0, *DERIVED_PORT_OFFSETS)}
        if ports & _handed_out:
            continue
        if all(port_free(host, p) for p in ports) and port_free("0.0.0.0", port + NCCL_PORT_OFFSET):
            _handed_out.update(ports)
            return port
    raise WorkerStartError(f"no free worker port (with its derived ports) in {WORKER_PORTS} after {attempts} tries")


def stop_process_group(proc: subprocess.Popen | None, sig: int, grace: float) -> None:
    """Send ``sig`` to the child's process group; SIGKILL it if it has not exited after ``grace`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


def cpu_share(workers: int) -> int:
    """Compute threads for each of ``workers`` workers sharing this host's cores: at least 1.

    A CPU worker's torch uses every core by default; several on one host then run more compute threads than
    cores, and each parallel region waits at its barrier for a thread the OS has descheduled. Measured on
    the 2-core CI machine: one 288-token request took 16-30 ms alone and 0.1-1.4 s while any other process
    (even at nice 19) kept one core busy; with one thread per worker, 17-32 ms either way."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


@dataclass
class WorkerProcess:
    log_path: Path
    """Where the worker's stdout and stderr go."""
    args: list[str] = field(default_factory=list)
    """Extra launcher flags (SGLang's and --moe-*)."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: pick a free port."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the worker."""
    threads: int | None = None
    """Compute threads of the worker's torch (``OMP_NUM_THREADS``; see ``cpu_share``); None: torch's default
    (every core)."""
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> WorkerProcess:
        if self.port == 0:
            self.port = free_worker_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        cmd = [sys.executable, "-m", "sgl_moe.launch_server", "--host", self.host, "--port", str(self.port), *self.args]
        self.started_at = time.time()
        # Its own process group, so stop() reaches SGLang's scheduler and detokenizer too.
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env,
                                          **({"OMP_NUM_THREADS": str(self.threads)} if self.threads else {})})
        log.close()
        return self

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float | None = None, progress: Callable[[float, str], None] | None = None,
                   note_every_s: float = 10.0) -> dict[str, Any]:
        """Block until the worker answers /health and /sgl_moe/info, its Θ profile done; return the info.

        ``timeout`` (None: ``ready_timeout_s(self.args)``, the longest the worker itself may take); ``progress``
        is called every ``note_every_s`` with the seconds since start and what the worker says it is doing (its
        503 ``/health`` body's ``detail``, e.g. a Θ profile waiting for a quiet host; "" before it answers)."""
        assert self.proc is not None, "start() first"
        timeout = ready_timeout_s(self.args) if timeout is None else timeout
        deadline = time.time() + timeout
        last_note = time.time()
        status = ""
        with httpx.Client(timeout=5.0) as client:
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise WorkerStartError(f"worker exited with status {self.proc.returncode} during start-up; "
                                           f"log {self.log_path}:\n{self.log_tail()}")
                try:
                    health = client.get(f"{self.url}/health")
                    if health.status_code == 200:
                        info = client.get(f"{self.url}/sgl_moe/info")
                        # Ready once its Θ profile (start-up requests of its own) has ended.
                        if info.status_code == 200 and info.json().get("saturation", {}).get("state") != "calibrating":
                            self.ready_seconds = time.time() - self.started_at
                            return info.json()
                    else:
                        status = _detail(health) or status
                except httpx.TransportError:
                    pass
                if progress and time.time() - last_note >= note_every_s:
                    last_note = time.time()
                    progress(time.time() - self.started_at, status)
                time.sleep(0.5)
        self.stop()
        raise WorkerStartError(f"worker not ready after {timeout:.0f} s (last said: {status or 'nothing'}); log "
                               f"{self.log_path}:\n{self.log_tail()}")

    def rss_bytes(self) -> int:
        """Resident memory of the worker and all its children (SGLang runs three processes)."""
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return 0
        root = psutil.Process(self.proc.pid)
        total = 0
        for p in [root, *root.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def stop(self, grace: float = 20.0) -> None:
        stop_process_group(self.proc, signal.SIGTERM, grace)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


START_ALLOWANCE_S = 240.0
"""What a CPU worker takes to start before its Θ profile (SGLang's load and warm-up; about a minute on the 2-core VM),
with room for a busy host."""


def ready_timeout_s(worker_args: list[str]) -> float:
    """The longest a worker started with ``worker_args`` may take to become ready: its start, then its Θ profile up to
    ``--moe-calibration-timeout-s`` (which keeps a fallback Θ when the host stays busy, rather than failing)."""
    calibration = MoeArgs().calibration_timeout_s
    for i, arg in enumerate(worker_args):
        value = arg.partition("=")[2] if arg.startswith("--moe-calibration-timeout-s=") else (
            worker_args[i + 1] if arg == "--moe-calibration-timeout-s" and i + 1 < len(worker_args) else None)
        if value is not None:
            try:
                calibration = float(value)
            except ValueError:
                pass  # the worker refuses it at start
    return START_ALLOWANCE_S + calibration


def printed_progress(label: str, file: TextIO | None = None) -> Callable[[float, str], None]:
    """A ``wait_ready`` progress that prints ``  <label> (<seconds> s): <what the worker says>`` to ``file``
    (stdout by default)."""

    def progress(seconds: float, status: str) -> None:
        print(f"  {label} ({seconds:.0f} s){': ' + status if status else ''}", file=file or sys.stdout, flush=True)

    return progress


def _detail(health: httpx.Response) -> str:
    """What a starting worker's 503 ``/health`` says it is doing (``readiness.ReadinessGate``), or ""."""
    try:
        body = health.json()
    except ValueError:
        return ""
    return str(body.get("detail") or "") if isinstance(body, dict) else ""


def stop_all(workers: Iterable[WorkerProcess]) -> None:
    """Stop workers side by side: each takes 1-6 s to exit (SGLang's shutdown: a worker whose scheduler is signalled
    with it takes that for a crash and waits 5 s before its crash diagnostics), so one after another adds up."""
    workers = list(workers)
    with ThreadPoolExecutor(max(1, len(workers))) as pool:
        list(pool.map(WorkerProcess.stop, workers))
