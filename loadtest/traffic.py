"""What the locust load test sends and how it judges each answer (pure: no locust, no gevent).

``loadtest/locustfile.py`` holds only the locust classes; this module holds the workload stream, the
request bodies for both APIs and the checks that turn an answer into a failure reason, so they can be
tested without starting locust (which monkey-patches the process with gevent).

Two APIs replay the same tasks (``SGL_MOE_API`` / ``--api``):

* ``classify``: one ``POST /v1/classify`` per task (contract A);
* ``generate``: the task's prefill units (``sgl_moe.router.front.prefill_tasks.expand_text``: one for classify
  and choice, one per candidate for multi) as ``POST /generate`` with ``max_new_tokens=1``, greedy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from sgl_moe.router.front.prefill_tasks import expand_text
from sgl_moe.workloads import TABLE2, WorkloadConfig, WorkloadRequest, generate, to_task

Api = Literal["classify", "generate"]
APIS: tuple[str, ...] = ("classify", "generate")
CLASSIFY_PATH = "/v1/classify"
GENERATE_PATH = "/generate"

PASS_REQUESTS = 1_000_000
"""Requests per pass of a stream; a stream that runs out starts the next pass with the next seed."""
WORKER_SEED_STRIDE = 1_000_003
"""Seed offset per locust worker process, so distributed workers replay different requests."""


def user_weight(workload: str) -> int:
    """A per-workload user class's locust weight: Table 2's request count in hundreds (240, 240, 120 ...)."""
    return max(TABLE2[workload].requests // 100, 1)


@dataclass(frozen=True)
class StreamOptions:
    """How a user class's stream is generated (the locustfile fills it from its custom options)."""

    workload_scale: float = 8.0
    """Divide Table 2's context lengths by this (``WorkloadConfig.length_scale``)."""
    workload_seed: int = 0
    """Seed of the first pass."""
    max_context: int = 3900
    """Clip prompts to this many tokens (``WorkloadConfig.max_context``)."""


class TaskStream:
    """An endless, seeded stream of ``(request, task)`` for some workloads.

    One stream is shared by all users of a class in a locust process: together they replay the workload
    in order, as an offline pipeline would, instead of each user sending the same first requests.
    """

    def __init__(self, workloads: tuple[str, ...], opts: StreamOptions, worker_index: int = 0) -> None:
        self.workloads = workloads
        self.opts = opts
        self.seed = opts.workload_seed + WORKER_SEED_STRIDE * worker_index
        self.passes = 0
        self.sent = 0
        self._it: Iterator[WorkloadRequest] = self._pass()

    def _pass(self) -> Iterator[WorkloadRequest]:
        cfg = WorkloadConfig(workloads=self.workloads, requests=PASS_REQUESTS, length_scale=self.opts.workload_scale,
                             max_context=self.opts.max_context, seed=self.seed + self.passes)
        return generate(cfg)

    def next(self) -> tuple[WorkloadRequest, dict]:
        for req in self._it:
            self.sent += 1
            return req, to_task(req)
        self.passes += 1
        self._it = self._pass()
        return self.next()


def classify_body(task: dict) -> bytes:
    return orjson.dumps({"inputs": [task]})


def generate_bodies(task: dict) -> list[bytes]:
    """One ``/generate`` body per prefill unit of ``task``, in unit order."""
    return [orjson.dumps({"text": unit.prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
            for unit in expand_text(task)]


def _load(body: bytes) -> Any:
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None


def _http_failure(status: int, body: bytes) -> str:
    payload = _load(body)
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return f"HTTP {status}: {err['message']}"[:300]
    return f"HTTP {status}: {body[:200].decode(errors='replace')}"


def check_classify(status: int, body: bytes) -> str | None:
    """None if ``body`` is a successful contract-A answer for one task, else why it is a failure."""
    if not 200 <= status < 300:
        return _http_failure(status, body)
    payload = _load(body)
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, list) or len(results) != 1 or not isinstance(results[0], dict):
        return f"malformed /v1/classify answer: {body[:200].decode(errors='replace')}"
    result = results[0]
    if "error" in result:
        err = result["error"] if isinstance(result["error"], dict) else {"message": result["error"]}
        return f"result error {err.get('code')}: {err.get('message')}"[:300]
    if not isinstance(result.get("probs"), list) or not result["probs"]:
        return "malformed /v1/classify result: no probs"
    return None


def check_generate(status: int, body: bytes) -> str | None:
    """None if ``body`` is a successful ``/generate`` answer, else why it is a failure."""
    if not 200 <= status < 300:
        return _http_failure(status, body)
    payload = _load(body)
    if not isinstance(payload, dict) or "error" in payload or not isinstance(payload.get("meta_info"), dict):
        return f"malformed /generate answer: {body[:200].decode(errors='replace')}"
    return None


def request_name(api: str, workload: str) -> str:
    """The locust statistics row: one per API path and workload."""
    return f"{CLASSIFY_PATH if api == 'classify' else GENERATE_PATH} {workload}"

