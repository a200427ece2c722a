"""A small synchronous client for the router's HTTP API (used by the demo, tests and benchmarks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def generate(url: str, text: str, max_new_tokens: int = 1, timeout: float = 120.0, **extra: Any) -> httpx.Response:
    """``POST /generate`` with greedy sampling."""
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}, **extra}
    return httpx.post(f"{url}/generate", json=body, timeout=timeout)


def workers(url: str) -> dict[str, dict[str, Any]]:
    """``GET /workers`` keyed by worker id."""
    return {w["id"]: w for w in httpx.get(f"{url}/workers", timeout=10).json()["workers"]}


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``sgl_moe_router_<name>`` (counter or gauge) matching ``labels``."""
    full = f"sgl_moe_router_{name}"
    total, found = 0.0, False
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] not in (full, f"{full}_total"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
            found = True
    if not found:
        raise KeyError(f"metric {full} {labels} is not exported")
    return total


def wait_until(predicate: Callable[[], T], timeout: float = 15.0, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; return it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
