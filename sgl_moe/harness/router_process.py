"""The router started as a child process (``python -m sgl_moe.router``): used by the demo, tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sgl_moe.harness.worker_process import free_port, stop_process_group


class RouterStartError(RuntimeError):
    """The router exited or its workers did not all join in time; the message carries its log."""


@dataclass
class RouterProcess:
    log_path: Path
    worker_urls: list[str]
    args: list[str] = field(default_factory=list)
    """Extra router flags."""
    host: str = "127.0.0.1"
    port: int = 0
    proc: subprocess.Popen | None = None
    source: Path | None = None
    """Run the router of this checkout instead of the installed one (``python -m`` from there imports its
    ``sgl_moe``): a benchmark comparing two versions side by side."""
    wrap: list[str] = field(default_factory=list)
    """A command the router runs under (``callgrind.command``: counting its instructions)."""
    python: str | None = None
    """The interpreter the router runs on (None: this one, ``sys.executable``): a benchmark comparing two builds
    of Python side by side."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> RouterProcess:
        if self.port == 0:
            self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        cmd = [*self.wrap, self.python or sys.executable, "-m", "sgl_moe.router", "--host", self.host,
               "--port", str(self.port), "--worker-urls", *self.worker_urls, *self.args]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=self.source)
        log.close()
        return self

    @property
    def admin_headers(self) -> dict[str, str]:
        """The ``Authorization`` header for the admin routes, when the router was given an admin key."""
        key = os.environ.get("SGL_MOE_ADMIN_API_KEY")
        for i, arg in enumerate(self.args):
            if arg == "--admin-api-key" and i + 1 < len(self.args):
                key = self.args[i + 1]
            elif arg.startswith("--admin-api-key="):
                key = arg.split("=", 1)[1]
        return {"Authorization": f"Bearer {key}"} if key else {}

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Block until every worker URL has joined and is healthy; return ``GET /workers``."""
        assert self.proc is not None, "start() first"
        deadline = time.time() + timeout
        with httpx.Client(timeout=5.0) as client:
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise RouterStartError(f"router exited with status {self.proc.returncode}; log:\n"
                                           f"{self.log_text()[-3000:]}")
                try:
                    workers = client.get(f"{self.url}/workers", headers=self.admin_headers).json()
                    healthy = {w["url"] for w in workers["workers"] if w["state"] == "healthy"}
                    if healthy >= set(self.worker_urls):
                        return workers
                except (httpx.TransportError, ValueError, KeyError):
                    pass
                time.sleep(0.2)
        self.stop()
        raise RouterStartError(f"router not ready after {timeout:.0f} s; log:\n{self.log_text()[-3000:]}")

    def stop(self, grace: float = 10.0) -> None:
        stop_process_group(self.proc, signal.SIGINT, grace)

    def __enter__(self) -> RouterProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
