"""Every request kind a CPU worker of the shipped model serves, through the router, on both placement paths.

The counterpart of ``tests/router/test_request_kinds.py`` against the session ``cluster``. Each row is sent
straight to a worker once; through the router it must get the same status (a worker's refusal, such as a
``lora_path`` on a worker without LoRA, reaches the client as the worker's 4xx) and never a 5xx. A row the
worker itself cannot serve (5xx straight to it) is skipped. Answers without ``x-sgl-moe-worker`` come from the
router itself and must have its one JSON error shape.

Paths: ``python -m sgl_moe.router`` at ``--log-level info`` (the load-ordered fast path: Θ and the request
overhead are pinned so the workers are uniform) and at ``--log-level debug`` (every decision scores every
worker); the shipped tokenizer is exact there. The router app in-process with its tokenizer's ``exact`` set
False (what any non-generic tokenizer class gives) covers routing without affinity on both paths, with the
client's text forwarded.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.harness.router_process import RouterProcess, RouterStartError
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.service import ROUTER, build_app

THETA = "1e18"
"""Pinned Θ: one Θ for both workers (the fast path needs it) and never saturated by this file's requests."""
OVERHEAD = "3e8"
"""Pinned request overhead: each worker measures its own (noise makes them differ), and the fast path needs one."""
HIDDEN = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())["hidden_size"]
TEXT = "Routing every request kind: the quick brown fox jumps over the lazy dog. " * 4
OTHER = "Pack my box with five dozen liquor jugs, then route it. " * 3
USER = [{"role": "user", "content": TEXT}]
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAAB"
       "JRU5ErkJggg==")
SAMPLING = {"max_new_tokens": 2, "temperature": 0}

ROWS = {
    "generate_text": ("/generate", {"text": TEXT, "sampling_params": SAMPLING}),
    "generate_input_ids": ("/generate", {"input_ids": list(range(10, 90)), "sampling_params": SAMPLING}),
    "generate_batch_text": ("/generate", {"text": [TEXT, OTHER], "sampling_params": SAMPLING}),
    "generate_batch_input_ids": ("/generate", {"input_ids": [list(range(10, 90)), list(range(20, 50))],
                                               "sampling_params": SAMPLING}),
    "generate_lora_path": ("/generate", {"text": TEXT, "lora_path": "adapter-a", "sampling_params": SAMPLING}),
    "generate_extra_key": ("/generate", {"text": TEXT, "extra_key": "tenant-7", "sampling_params": SAMPLING}),
    "generate_cache_salt": ("/generate", {"text": TEXT, "cache_salt": "salt-1", "sampling_params": SAMPLING}),
    "generate_input_embeds": ("/generate", {"input_embeds": [[0.01 * (i % 7)] * HIDDEN for i in range(24)],
                                            "sampling_params": SAMPLING}),
    "generate_image_data": ("/generate", {"text": TEXT, "image_data": PNG, "sampling_params": SAMPLING}),
    "generate_stream": ("/generate", {"text": TEXT, "stream": True, "sampling_params": SAMPLING}),
    "completions_string": ("/v1/completions", {"prompt": TEXT, "max_tokens": 2, "temperature": 0}),
    "completions_list": ("/v1/completions", {"prompt": [TEXT, OTHER], "max_tokens": 2, "temperature": 0}),
    "chat_without_template": ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}),
    "chat_input_ids": ("/v1/chat/completions", {"messages": USER, "input_ids": list(range(10, 70)),
                                                "max_tokens": 2}),
    "chat_input_ids_stream": ("/v1/chat/completions", {"messages": USER, "input_ids": list(range(10, 70)),
                                                       "max_tokens": 2, "stream": True}),
    "score": ("/v1/score", {"query": TEXT, "items": [" yes", " no"], "label_token_ids": [5, 6]}),
    "decisions": ("/v1/decisions", {"input": TEXT, "questions": [{"id": "q", "type": "yes_no", "question": "Is it?"}]}),
}


@pytest.fixture(scope="module")
def direct(cluster) -> dict[str, tuple[int, bytes]]:
    """Each row's status and body straight from a worker."""
    out = {}
    with httpx.Client(timeout=120) as client:
        for name, (endpoint, body) in ROWS.items():
            resp = client.post(cluster[0].url + endpoint, json=body)
            out[name] = resp.status_code, resp.content
    return out


@pytest.fixture(scope="module")
def routers(cluster, tmp_path_factory):
    """``python -m sgl_moe.router`` on each placement path, in front of both workers."""
    folder = tmp_path_factory.mktemp("request-kinds")
    started = {}
    try:
        for path, level in (("fast", "info"), ("scan", "debug")):
            r = RouterProcess(log_path=folder / f"router-{path}.log", worker_urls=[w.url for w in cluster],
                              args=["--log-level", level, "--saturation-flops", THETA,
                                    "--request-overhead-flops", OVERHEAD])
            started[path] = r
            r.start()
            r.wait_ready(timeout=60)
    except RouterStartError as exc:
        for r in started.values():
            r.stop()
        pytest.fail(str(exc))
    yield started
    for r in started.values():
        r.stop()


def check(name: str, status: int, headers: dict, payload: bytes, direct: dict[str, tuple[int, bytes]]) -> None:
    want, want_body = direct[name]
    headers = {k.lower(): v for k, v in headers.items()}
    if want >= 500:
        pytest.skip(f"the worker itself cannot serve {name}: {want} {want_body[:200]!r}")
    assert status < 500, payload[:500]
    assert status == want, (payload[:300], want_body[:300])
    if "x-sgl-moe-worker" not in headers:  # answered by the router itself: its one error shape
        err = orjson.loads(payload)["error"]
        assert list(err) == ["message", "type", "param", "code"] and err["code"] == status, err
    elif status == 200 and ROWS[name][1].get("stream"):
        assert payload.rstrip().endswith(b"data: [DONE]"), payload[-200:]


@pytest.mark.parametrize("path", ["fast", "scan"])
@pytest.mark.parametrize("name", list(ROWS))
def test_request_kind_through_the_router(name, path, routers, direct):
    endpoint, body = ROWS[name]
    resp = httpx.post(routers[path].url + endpoint, json=body, timeout=120)
    check(name, resp.status_code, dict(resp.headers), resp.content, direct)


@pytest.mark.parametrize("path", ["fast", "scan"])
@pytest.mark.parametrize("name", list(ROWS))
def test_request_kind_without_affinity(name, path, cluster, direct):
    """The tokenizer not reproduced exactly: routed by load, the client's text forwarded as it was sent."""
    endpoint, body = ROWS[name]

    async def scenario() -> tuple[int, dict, bytes, int]:
        cfg = RouterConfig(worker_urls=tuple(w.url for w in cluster), saturation_flops=float(THETA),
                           request_overhead_flops=float(OVERHEAD))
        async with TestClient(TestServer(build_app(cfg))) as client:
            router = client.server.app[ROUTER]
            for _ in range(600):
                if len(router.pool.workers) == len(cluster) and router.pool.tokenizer is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the workers did not join the in-process router")
            router.pool.tokenizer.exact = False
            router.scheduler.scan_all = path == "scan"
            fast = router.scheduler.fast_path
            decide, calls = fast.decide, []
            fast.decide = lambda *a: calls.append(1) or decide(*a)
            resp = await client.post(endpoint, json=body)
            return resp.status, dict(resp.headers), await resp.read(), len(calls)

    status, headers, payload, fast_calls = asyncio.run(scenario())
    check(name, status, headers, payload, direct)
    if "x-sgl-moe-worker" in headers:
        assert (fast_calls > 0) == (path == "fast")
