"""How many CPU cores this process may really use: its affinity mask, capped by its cgroup's CPU quota.

``os.cpu_count()`` counts the host's cores; on a slice of a large machine (a container with a quota, a
process pinned to some cores) that over-sizes thread pools. Used to size the CPU experts' threads (overlap
bench) and reported by the GPU probe. Standard library only.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class HostCpus:
    os_cpu_count: int | None
    """What ``os.cpu_count()`` says (the host's cores)."""
    affinity: int | None
    """Cores in this process's affinity mask (``os.sched_getaffinity``), None where the OS has no such call."""
    quota_cpus: float | None
    """The cgroup CPU quota in cores (quota / period), None when unlimited or unreadable."""
    quota_source: str | None
    """The file the quota was read from."""

    @property
    def usable(self) -> int:
        """min(affinity, ceil(quota)), at least 1."""
        n = self.affinity or self.os_cpu_count or 1
        if self.quota_cpus is not None:
            n = min(n, max(1, math.ceil(self.quota_cpus)))
        return max(1, n)

    def as_dict(self) -> dict:
        return {**asdict(self), "usable": self.usable}


def _cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """This process's cgroup folders, innermost first, then the root (v2 ``0::/path``; v1 ``N:cpu,...:/path``)."""
    dirs: list[Path] = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # v2 unified
            base = root
        elif "cpu" in controllers.split(","):  # v1 cpu controller
            base = root / "cpu" if (root / "cpu").is_dir() else root / controllers
        else:
            continue
        p = base / rel if rel else base
        while True:  # the innermost limit applies, but a parent's quota caps it too: check them all
            dirs.append(p)
            if p == base:
                break
            p = p.parent
    dirs += [root, root / "cpu"]
    return dirs


def _quota(root: Path, proc_cgroup: Path) -> tuple[float | None, str | None]:
    best: tuple[float | None, str | None] = (None, None)
    for d in _cgroup_dirs(root, proc_cgroup):
        cores = None
        v2 = d / "cpu.max"
        v1q, v1p = d / "cpu.cfs_quota_us", d / "cpu.cfs_period_us"
        try:
            if v2.is_file():
                quota, _, period = v2.read_text().strip().partition(" ")
                if quota != "max":
                    cores, src = int(quota) / int(period or 100000), str(v2)
            elif v1q.is_file() and v1p.is_file():
                quota_us = int(v1q.read_text().strip())
                if quota_us > 0:
                    cores, src = quota_us / int(v1p.read_text().strip()), str(v1q)
        except (OSError, ValueError):
            continue
        if cores is not None and (best[0] is None or cores < best[0]):
            best = (cores, src)
    return best


def host_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> HostCpus:
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    quota, source = _quota(root, proc_cgroup)
    return HostCpus(os.cpu_count(), affinity, quota, source)


def usable_cpus() -> int:
    """Cores this process may use (affinity, capped by the cgroup quota)."""
    return host_cpus().usable
