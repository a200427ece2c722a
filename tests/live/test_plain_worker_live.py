"""A genuinely plain SGLang server (``python -m sglang.launch_server``, no ``/sgl_moe/info``) behind the router:
it joins with only ``--tokenizer-path`` given, ``GET /workers`` says what was learned and from where, and a
repeated prompt is routed with affinity (the router's predicted cached tokens equal the worker's own count).

On a machine without a usable CUDA device the server runs under the environment and server arguments
``sgl_moe.cpu_compat`` prescribes (SGLang's CPU engine, the stand-in ``sgl_kernel``), as the project's own
launcher applies them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

import httpx
import pytest

from sgl_moe import DEFAULT_MODEL_DIR, cpu_compat
from sgl_moe.harness.router_client import generate, wait_until, workers
from sgl_moe.harness.worker_process import free_port, stop_process_group

MODEL = str(DEFAULT_MODEL_DIR)
CPU_DEFAULTS = ["--dtype", "float32", "--mem-fraction-static", "0.5", "--sleep-on-idle"]
"""What ``sgl_moe.launch_server`` adds on the CPU engine (exact float32, memory headroom, no idle polling)."""


@pytest.fixture(scope="module")
def plain_sglang(tmp_path_factory):
    """``python -m sglang.launch_server`` on the shipped model, page size 16, KV events on bound loopback."""
    port, events, replay = free_port(), free_port(), free_port()
    args = ["--model-path", MODEL, "--host", "127.0.0.1", "--port", str(port), "--page-size", "16",
            "--max-total-tokens", "16384", "--kv-events-config", json.dumps(
                {"publisher": "zmq", "bind": True, "topic": "kv", "endpoint": f"tcp://127.0.0.1:{events}",
                 "replay_endpoint": f"tcp://127.0.0.1:{replay}"})]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    plan = cpu_compat.probe()
    plan.apply(env)  # the child's environment only
    for dest, value in plan.required_server_args.items():
        args += [f"--{dest.replace('_', '-')}"] + ([] if value is True else [str(value)])
    if plan.cpu_engine:
        args += CPU_DEFAULTS
    log_path = tmp_path_factory.mktemp("plain") / "sglang.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"plain SGLang did not start; log {log_path}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        stop_process_group(proc, signal.SIGTERM, 20)


def test_plain_sglang_joins_reports_provenance_and_routes_with_affinity(plain_sglang, router_factory):
    assert httpx.get(f"{plain_sglang}/sgl_moe/info", timeout=10).status_code == 404  # genuinely plain
    router = router_factory([SimpleNamespace(url=plain_sglang)], "--tokenizer-path", MODEL)
    [w] = workers(router.url).values()
    learned = w["learned"]
    assert learned["tokenizer"] == f"local directory {MODEL} (router flag --tokenizer-path)"
    assert learned["page_size"] == "server info (GET /server_info: page_size)" and w["page_size"] == 16
    assert learned["kv_events"] == "server info (GET /server_info: kv_events)"
    assert learned["flops"].startswith(f"local config {MODEL}/config.json")
    assert learned["saturation"].startswith("derived by the router") and w["theta_source"].startswith("router: ")
    assert learned["model_name"].startswith("model info") and w["model_path"] == MODEL
    assert [e["endpoint"] for e in w["events"]] and w["events"][0]["endpoint"].startswith("tcp://127.0.0.1:")
    assert "a plain SGLang worker, learned:" in router.log_text()

    tag = uuid.uuid4().hex
    text = f"# {tag}\n" + " ".join(f"value_{tag[i % 32]}{i}" for i in range(80)) + "\n"
    first = generate(router.url, text)
    assert first.status_code == 200, first.text
    assert first.headers["x-sgl-moe-predicted-cached-tokens"] == "0"
    prompt_tokens = first.json()["meta_info"]["prompt_tokens"]
    wait_until(lambda: (s := workers(router.url)[w["id"]])["committed_blocks"] >= prompt_tokens // 16
               and s["pending_blocks"] == 0, what="the worker's KV events committed")
    second = generate(router.url, text + "more")
    assert second.status_code == 200, second.text
    reported = second.json()["meta_info"]["cached_tokens"]
    assert reported >= 64
    assert int(second.headers["x-sgl-moe-predicted-cached-tokens"]) == reported
