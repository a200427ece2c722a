"""Tables and JSON of simulated runs."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from typing import Any

from sgl_moe.simulator.simulation import ROUTER_POLICIES, SimResult


def label(policy: str) -> str:
    return f"sgl_moe {policy}" if policy in ROUTER_POLICIES else f"sglang-router {policy} (model)"


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def table(results: Sequence[SimResult], title: str) -> str:
    """One row per policy: throughput, cache reuse, latency, simulated and wall time."""
    head = (f"{'policy':<36} {'req/s':>9} {'prompt tok/s':>12} {'cached':>7} {'oracle':>7} {'computed':>9} "
            f"{'p50 s':>8} {'p99 s':>8} {'sim s':>8} {'wall s':>7} {'us/req':>7}")
    lines = [title, head, "-" * len(head)]
    for r in results:
        lines.append(f"{label(r.policy):<36} {r.throughput_rps:>9.1f} {_si(r.prompt_tokens_per_s):>12} "
                     f"{r.cached_fraction:>7.3f} {r.oracle_fraction:>7.3f} {_si(r.computed_tokens):>9} "
                     f"{r.latency_p50_s:>8.3f} {r.latency_p99_s:>8.3f} {r.sim_seconds:>8.2f} {r.wall_seconds:>7.1f} "
                     f"{r.cpu_seconds / max(r.units, 1) * 1e6:>7.0f}")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}
