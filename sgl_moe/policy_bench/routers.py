"""The routers under test, each started fresh in front of the same workers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from sgl_moe.harness.router_process import RouterProcess
from sgl_moe.harness.worker_process import free_port, stop_process_group

OURS = ("longest_block_match", "round_robin", "least_flops")
SGLANG_ROUTER = ("cache_aware", "power_of_two")
POLICIES = OURS + SGLANG_ROUTER
SGLANG_ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
"""Every ``--policy`` sglang-router accepts in front of plain workers (``engine="sglang-router"``)."""


def label(policy: str) -> str:
    return f"sgl_moe {policy}" if policy in OURS else f"sglang-router {policy}"


class RouterUnderTest:
    """Either ``python -m sgl_moe.router --policy P`` or ``python -m sglang_router.launch_router --policy P``.

    Which one follows from the policy's name (``OURS`` or ``SGLANG_ROUTER``) unless ``engine`` says:
    ``engine="sglang-router"`` runs a name both have (``round_robin``) with sglang-router."""

    def __init__(self, policy: str, worker_urls: list[str], log_path: Path, extra_args: list[str] | None = None,
                 engine: str | None = None, source: Path | None = None, wrap: list[str] | None = None,
                 python: str | None = None):
        if engine is None:
            if policy not in POLICIES:
                raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
            engine = "sgl_moe" if policy in OURS else "sglang-router"
        elif engine not in ("sgl_moe", "sglang-router") or \
                policy not in (OURS if engine == "sgl_moe" else SGLANG_ROUTER_POLICIES):
            raise ValueError(f"unknown {engine} policy {policy!r}")
        self.engine = engine
        self.policy = policy
        self.worker_urls = worker_urls
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.source = source
        """sgl_moe's router from this checkout instead of the installed one (``RouterProcess.source``)."""
        self.wrap = wrap or []
        """A command either router runs under (``callgrind.command``)."""
        self.python = python
        """sgl_moe's router on this interpreter instead of this one (``RouterProcess.python``)."""
        self.port = free_port()
        self._ours: RouterProcess | None = None
        self._proc: subprocess.Popen | None = None
        self.sync_seconds: float | None = None
        """sgl_moe's router: seconds from ready to every worker's event replay done (``_wait_tables_synced``)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> None:
        if self.engine == "sgl_moe":
            self._ours = RouterProcess(log_path=self.log_path, worker_urls=self.worker_urls, port=self.port,
                                       args=["--policy", self.policy, "--log-level", "info", *self.extra_args],
                                       source=self.source, wrap=self.wrap, python=self.python)
            self._ours.start()
            self._ours.wait_ready(timeout=timeout)
            self._wait_tables_synced(timeout)
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [*self.wrap, sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                 "--port", str(self.port), "--worker-urls", *self.worker_urls, "--policy", self.policy,
                 "--log-level", "warn", "--request-timeout-secs", "600", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_sglang_router(timeout)

    def _wait_sglang_router(self, timeout: float) -> None:
        """Ready when it lists every worker as healthy (its /workers), or failing that answers a /generate."""
        deadline = time.time() + timeout
        with httpx.Client(timeout=10.0) as client:
            while time.time() < deadline:
                if self._proc.poll() is not None:
                    raise RuntimeError(f"sglang-router exited ({self._proc.returncode}); log: {self.log_path}")
                try:
                    r = client.post(f"{self.url}/generate", json={"text": "ready?", "sampling_params":
                                                                   {"max_new_tokens": 1, "temperature": 0}})
                    if r.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"sglang-router not ready after {timeout:.0f} s; log: {self.log_path}")

    def _wait_tables_synced(self, timeout: float) -> None:
        """Until every worker's event stream has been replayed once (the router rebuilds a committed table from
        the worker's replay buffer when it connects: with workers that outlive many routers, thousands of
        batches, seconds of CPU on this 2-core host). The stream is offered after it, so a run measures
        routing, not a restart; the time it took is logged. Gives up silently after ``timeout``."""
        deadline, t0 = time.time() + timeout, time.time()
        with httpx.Client(timeout=10.0) as client:
            while time.time() < deadline:
                try:
                    workers = client.get(f"{self.url}/workers").json()
                    workers = workers.get("workers", workers) if isinstance(workers, dict) else workers
                    if workers and all(e["replays"] + e["replay_failures"] >= 1
                                       for w in workers for e in w.get("events") or [{"replays": 1,
                                                                                     "replay_failures": 0}]):
                        self.sync_seconds = time.time() - t0
                        return
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    pass
                time.sleep(0.2)

    @property
    def pid(self) -> int | None:
        """The router's first process (the placement owner with ``--front-processes`` > 1), once started."""
        proc = self._ours.proc if self._ours is not None else self._proc
        return proc.pid if proc is not None else None

    def top_cpu_seconds(self) -> float | None:
        """CPU time of the router's first process alone (with ``--front-processes`` > 1: the placement owner)."""
        proc = self._ours.proc if self._ours is not None else self._proc
        if proc is None or proc.poll() is not None:
            return None
        try:
            import psutil

            t = psutil.Process(proc.pid).cpu_times()
            return t.user + t.system
        except Exception:  # noqa: BLE001 - a diagnostic only
            return None

    def cpu_seconds(self) -> float | None:
        """CPU time the router's processes have used so far (user + system), or None if unknown."""
        times = self.cpu_times()
        return None if times is None else times[0] + times[1]

    def cpu_times(self) -> tuple[float, float] | None:
        """(user, system) CPU seconds the router's processes have used so far, or None if unknown. System time is
        the kernel's work for the router, most of it its sockets: on loopback a write runs the receiver's TCP path
        too."""
        proc = self._ours.proc if self._ours is not None else self._proc
        if proc is None or proc.poll() is not None:
            return None
        try:
            import psutil

            root = psutil.Process(proc.pid)
            user = system = 0.0
            for p in [root, *root.children(recursive=True)]:
                t = p.cpu_times()
                user += t.user
                system += t.system
            return user, system
        except Exception:  # noqa: BLE001 - a diagnostic only
            return None

    def stop(self) -> None:
        if self._ours is not None:
            self._ours.stop()
        if self._proc is not None:
            stop_process_group(self._proc, 15, 10.0)


def flush_caches(worker_urls: list[str], timeout: float = 60.0) -> None:
    """Empty every worker's prefix cache (SGLang refuses while requests run: retry until idle)."""
    deadline = time.time() + timeout
    for url in worker_urls:
        while True:
            r = httpx.post(f"{url}/flush_cache", timeout=30)
            if r.status_code == 200:
                break
            if time.time() > deadline:
                raise RuntimeError(f"{url} would not flush its cache: {r.status_code} {r.text[:200]}")
            time.sleep(0.5)
