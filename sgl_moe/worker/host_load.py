"""CPU time this host spends outside one process tree: what another program takes from a profile's cores.

A Θ profile times the worker's throughput; another worker loading its model, a benchmark client or any other
busy process on the same host slows the profile's levels unevenly and the knee it finds is the host's, not the
worker's. ``HostLoad`` reads the host's busy time (``/proc/stat``) and the worker's own process tree's CPU time
(psutil), so the profile can wait for a quiet host and say when it was disturbed. Linux only; elsewhere
``available`` is false and the profile runs unchecked.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Sample:
    at: float
    """``time.monotonic()``"""
    host_busy_s: float
    """CPU seconds every core of the host spent busy since boot."""
    own_s: float
    """CPU seconds the watched process tree spent (its live processes)."""


class HostLoad:
    """Samples of host and own CPU time; ``foreign_cores`` between two samples."""

    def __init__(self, root_pid: int | None = None) -> None:
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.available = PROC_STAT.is_file()
        self._tick = os.sysconf("SC_CLK_TCK") if self.available else 100
        self.cores = os.cpu_count() or 1

    def sample(self) -> Sample:
        return Sample(time.monotonic(), self._host_busy(), self._own())

    def foreign_cores(self, start: Sample, end: Sample) -> float:
        """Cores' worth of CPU that processes outside the tree used between the samples (0 without /proc)."""
        elapsed = end.at - start.at
        if not self.available or elapsed <= 0:
            return 0.0
        foreign = (end.host_busy_s - start.host_busy_s) - (end.own_s - start.own_s)
        return max(0.0, foreign / elapsed)

    def wait_quiet(self, limit_cores: float, timeout_s: float, window_s: float = 1.0) -> float:
        """Sample in ``window_s`` windows until the foreign load is at most ``limit_cores`` or ``timeout_s``
        passed; returns the last window's foreign load."""
        deadline = time.monotonic() + timeout_s
        while True:
            start = self.sample()
            time.sleep(window_s)
            load = self.foreign_cores(start, self.sample())
            if load <= limit_cores or time.monotonic() >= deadline:
                return load

    def _host_busy(self) -> float:
        if not self.available:
            return 0.0
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()
        # cpu user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
        values = [int(v) for v in fields[1:9]]
        busy = sum(values) - values[3] - values[4]
        return busy / self._tick

    def _own(self) -> float:
        import psutil

        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total
