"""Hostile input through the router to two real SGLang CPU workers: none takes a worker down or stalls the router.

Both workers are started with the test-only fault ``SGL_MOE_DEBUG_CRASH_TOKEN`` (``patches/debug_fault``): a
forward pass that sees that token raises inside SGLang's scheduler, which takes the worker down, as an
out-of-vocabulary id did before the router checked ids. The crash test runs last: it kills one of them.
"""

from __future__ import annotations

import asyncio
import random
import string
import threading
import time

import httpx
import pytest

from sgl_moe.harness.worker_process import WorkerProcess, WorkerStartError
from sgl_moe.patches.debug_fault import ENV_VAR

WORKER_ARGS = ["--max-total-tokens", "16384", "--no-moe-theta-profile"]
"""As conftest's shared workers, without the start-up Θ profile: its random prompts would hit the planted
fault token and kill the worker before the test starts."""
CRASH = 4000  # a token id the shipped tokenizer never produces from the text below
ADMIN = "live-admin-key"


@pytest.fixture(scope="module")
def fault_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fault")
    workers = [WorkerProcess(log_path=folder / f"worker{i}.log", args=WORKER_ARGS, env={ENV_VAR: str(CRASH)}).start()
               for i in range(2)]
    try:
        for w in workers:
            w.info = w.wait_ready(timeout=600)
    except WorkerStartError as exc:
        for w in workers:
            w.stop()
        pytest.fail(str(exc))
    yield workers
    for w in workers:
        w.stop()


def admin(router) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def workers_answer(workers) -> list[int]:
    out = []
    for w in workers:
        try:
            out.append(httpx.get(f"{w.url}/model_info", timeout=10).status_code)
        except httpx.TransportError:
            out.append(0)
    return out


def test_out_of_vocabulary_and_empty_prompts_are_400_and_both_workers_stay_up(fault_pair, router_factory):
    router = router_factory(fault_pair, "--admin-api-key", ADMIN)
    vocab = fault_pair[0].info["vocab_size"]
    cases = [("/generate", {"input_ids": [999_999_999]}), ("/generate", {"input_ids": [1, vocab]}),
             ("/v1/completions", {"prompt": [vocab + 7]}), ("/generate", {"text": ""}),
             ("/v1/score", {"query": [1], "items": [[vocab]], "label_token_ids": [1]}),
             ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1,
                                                                      "logit_bias": {str(vocab + 1): 5.0}}})]
    for path, body in cases:
        r = httpx.post(router.url + path, json=body, timeout=60)
        assert r.status_code == 400, (path, r.text)
    assert all(w.proc.poll() is None for w in fault_pair)
    assert workers_answer(fault_pair) == [200, 200]
    r = httpx.post(router.url + "/generate", timeout=120,
                   json={"input_ids": [1, vocab - 1], "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200, r.text


def test_straight_to_a_worker_crashing_inputs_are_400_and_it_stays_up(fault_pair):
    """Clients that skip the router: the worker's own guard (``worker/input_guard``) refuses what would kill it."""
    w = fault_pair[0]
    vocab = w.info["vocab_size"]
    for path, body in (("/generate", {"text": ""}), ("/generate", {"input_ids": [999_999_999]}),
                       ("/v1/completions", {"model": w.info["model_name"], "prompt": [vocab]}),
                       ("/v1/score", {"query": [1], "items": [[vocab]], "label_token_ids": [1]})):
        r = httpx.post(w.url + path, json=body, timeout=60)
        assert r.status_code == 400, (path, r.status_code, r.text)
    assert w.proc.poll() is None and workers_answer([w]) == [200]
    r = httpx.post(w.url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 1}}, timeout=120)
    assert r.status_code == 200, r.text


def test_a_50_mb_body_is_413_at_once_and_health_stays_fast(fault_pair, router_factory):
    router = router_factory(fault_pair, "--admin-api-key", ADMIN)
    body = b'{"text": "' + b"a" * (50 * 2**20) + b'"}'
    t0 = time.perf_counter()
    r = httpx.post(router.url + "/generate", content=body, headers={"content-type": "application/json"}, timeout=60)
    elapsed = time.perf_counter() - t0
    assert r.status_code == 413 and elapsed < 1.0, (r.status_code, elapsed)
    print(f"\n50 MB body: {r.status_code} in {elapsed:.3f} s")

    # A large body under the limit (3.9 MB of text, tokenized before its token count is refused): /health and
    # /metrics answer while it is tokenized. Words drawn at random, so no cache of repeated words makes it quick.
    # Each byte a letter, one in seven a space: 3.9 MB (passes the length pre-check) of words seen once.
    table = bytes((string.ascii_lowercase * 10)[:224] + " " * 32, "ascii")
    text = random.Random(0).randbytes(39 * 10**5).translate(table).decode()
    result = {}

    def big():
        t = time.perf_counter()
        result["status"] = httpx.post(router.url + "/generate", json={"text": text}, timeout=120).status_code
        result["s"], result["done"] = time.perf_counter() - t, time.perf_counter()

    thread = threading.Thread(target=big)
    thread.start()
    time.sleep(0.3)
    t1 = time.perf_counter()
    assert httpx.get(router.url + "/health", timeout=30).status_code == 200
    assert httpx.get(router.url + "/metrics", timeout=30).status_code == 200
    answered = time.perf_counter()
    health_s = answered - t1
    thread.join()
    assert result["status"] == 400  # more than --max-request-tokens
    # Both answered while the large request was still being tokenized, and quickly.
    assert health_s < 0.5 and answered < result["done"], (health_s, result, answered)
    print(f"3.9 MB text: {result['status']} after {result['s']:.2f} s; /health + /metrics took {health_s:.3f} s")


def test_admin_routes_need_the_key_and_the_same_worker_under_another_url_is_refused(fault_pair, router_factory):
    router = router_factory(fault_pair, "--admin-api-key", ADMIN)
    w = fault_pair[0]
    other = w.url.replace("127.0.0.1", "localhost")
    assert httpx.post(router.url + "/workers", json={"url": other}, timeout=30).status_code == 401
    assert httpx.delete(router.url + "/workers/w0", timeout=30).status_code == 401
    assert httpx.get(router.url + "/workers", timeout=30).status_code == 401
    r = httpx.post(router.url + "/workers", json={"url": other}, headers=admin(router), timeout=60)
    assert r.status_code == 409 and "same instance id" in r.json()["error"]["message"], r.text
    r = httpx.post(router.url + "/workers", json={"url": "http://127.0.0.1:9"}, headers=admin(router), timeout=60)
    assert r.status_code == 400 and "127.0.0.1" not in r.text and "refused" not in r.text.lower(), r.text
    assert len(httpx.get(router.url + "/workers", headers=admin(router), timeout=30).json()["workers"]) == 2


def running(worker) -> int:
    loads = httpx.get(f"{worker.url}/v1/loads", timeout=30).json()
    ranks = loads.get("loads", loads) if isinstance(loads, dict) else loads
    return sum(int(r.get("num_running_reqs", 0)) + int(r.get("num_waiting_reqs", 0)) for r in ranks)


def test_a_client_that_disconnects_has_its_request_aborted_on_the_worker(fault_pair, router_factory):
    router = router_factory(fault_pair, "--admin-api-key", ADMIN)
    body = {"text": "Count slowly from one to ten thousand:", "sampling_params": {
        "max_new_tokens": 3000, "ignore_eos": True, "temperature": 0}}

    async def leave_early() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(2.0)) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(router.url + "/generate", json=body)

    asyncio.run(leave_early())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sum(running(w) for w in fault_pair):
        time.sleep(0.25)
    assert sum(running(w) for w in fault_pair) == 0  # a 3000-token decode, gone within seconds
    workers = httpx.get(router.url + "/workers", headers=admin(router), timeout=30).json()["workers"]
    assert all(w["inflight_requests"] == 0 and w["inflight_flops"] == 0 for w in workers), workers
    metrics = httpx.get(router.url + "/metrics", timeout=30).text
    assert "sgl_moe_router_client_aborts_total 1.0" in metrics


def test_n_of_100000_and_a_deep_regex_are_400_at_once_and_both_workers_keep_serving(fault_pair, router_factory):
    """Measured before ``--max-n``: this ``n`` held a worker past the client's 90 s timeout and the next request
    routed there timed out; the regex held a worker's grammar compiler for 11.8 s."""
    router = router_factory(fault_pair, "--admin-api-key", ADMIN)
    for body, flag in (({"text": "hello", "sampling_params": {"n": 100_000, "max_new_tokens": 1}}, "--max-n"),
                       ({"text": "hello", "sampling_params": {"regex": "(" * 3000 + "a" + ")" * 3000,
                                                             "max_new_tokens": 1}}, "--max-grammar-")):
        t0 = time.perf_counter()
        r = httpx.post(router.url + "/generate", json=body, headers=admin(router), timeout=60)
        assert r.status_code == 400 and flag in r.json()["error"]["message"], r.text
        assert time.perf_counter() - t0 < 1.0
    for w in fault_pair:
        t0 = time.perf_counter()
        r = httpx.post(w.url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 1}},
                       timeout=60)
        assert r.status_code == 200 and time.perf_counter() - t0 < 20, (r.text, time.perf_counter() - t0)
    workers = httpx.get(router.url + "/workers", headers=admin(router), timeout=30).json()["workers"]
    assert [w["state"] for w in workers] == ["healthy", "healthy"] and all(w["inflight_requests"] == 0
                                                                           for w in workers)


def test_a_request_that_kills_the_worker_it_runs_alone_on_is_refused_from_then_on(fault_pair, router_factory):
    """Last in this module: it kills both workers. Until issue 29 the router refused every request that was in
    flight on a dying worker for an hour, innocent ones included, and never retried it; now it retries each alone on
    another worker (the quarantine lane), so the poison, run alone, kills that one too and is refused from then on
    with 400 saying why. ``tests/router/test_quarantine.py`` shows innocent requests of a dead worker answered."""
    router = router_factory(fault_pair, "--admin-api-key", ADMIN)
    poison = {"input_ids": [1, 2, 3, CRASH, 5], "sampling_params": {"max_new_tokens": 1}}
    r = httpx.post(router.url + "/generate", json=poison, timeout=180)
    assert r.status_code == 400 and "ran alone on worker" in r.json()["error"]["message"], r.text
    time.sleep(2)
    assert [w.proc.poll() is None for w in fault_pair] == [False, False], "both workers died, one at a time"
    t0 = time.perf_counter()
    r = httpx.post(router.url + "/generate", json=poison, timeout=60)
    assert r.status_code == 400 and "died too" in r.json()["error"]["message"], r.text
    assert time.perf_counter() - t0 < 1.0
    metrics = httpx.get(router.url + "/metrics", timeout=30).text
    assert "sgl_moe_router_suspect_refusals_total 1.0" in metrics
    assert "sgl_moe_router_poison_convicted_total 1.0" in metrics
    assert "quarantine lane" in router.log_text()
