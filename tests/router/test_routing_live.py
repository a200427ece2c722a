"""The router in front of real SGLang workers: hashing, tables, placement, admission, API behaviour."""

import concurrent.futures as cf
import time
import uuid

import httpx
import pytest

pytestmark = pytest.mark.worker


def unique_text(words: int = 60) -> str:
    """Text no earlier test sent, so cache state from other tests cannot leak in."""
    tag = uuid.uuid4().hex
    return f"# {tag}\n" + " ".join(f"value_{tag[i % 32]}{i}" for i in range(words)) + "\n"


def generate(url, text, max_new_tokens=1, **extra):
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}, **extra}
    return httpx.post(f"{url}/generate", json=body, timeout=120)


def workers_state(router):
    return {w["id"]: w for w in httpx.get(f"{router.url}/workers", timeout=10).json()["workers"]}


def wait_until(predicate, timeout=15.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def metric(router, name, **labels):
    text = httpx.get(f"{router.url}/metrics", timeout=10).text
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(f"sgl_moe_router_{name}"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] not in (f"sgl_moe_router_{name}", f"sgl_moe_router_{name}_total"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
            found = True
    assert found, f"metric {name} {labels} not exported"
    return total


def test_prediction_matches_what_the_worker_reports(cluster, router_factory):
    """Router tokenization + block hashes + committed table agree with the worker's own prefix cache."""
    router = router_factory(cluster)
    text = unique_text(80)
    first = generate(router.url, text)
    assert first.status_code == 200, first.text
    assert first.headers["x-sgl-moe-predicted-cached-tokens"] == "0"
    worker = first.headers["x-sgl-moe-worker"]
    prompt_tokens = first.json()["meta_info"]["prompt_tokens"]
    assert prompt_tokens > 64
    # The worker's BlockStored events reach the committed table and retire the pending promise.
    wait_until(lambda: workers_state(router)[worker]["committed_blocks"] >= prompt_tokens // 16
               and workers_state(router)[worker]["pending_blocks"] == 0, what="blocks committed")
    second = generate(router.url, text + "more")
    assert second.headers["x-sgl-moe-worker"] == worker
    reported = second.json()["meta_info"]["cached_tokens"]
    assert reported >= 64
    assert int(second.headers["x-sgl-moe-predicted-cached-tokens"]) == reported
    assert metric(router, "predicted_cached_tokens", worker=worker) == metric(
        router, "reported_cached_tokens", worker=worker)


def test_burst_of_same_prefix_converges_on_one_worker(cluster, router_factory):
    router = router_factory(cluster)
    prefix = unique_text(120)
    with cf.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: generate(router.url, prefix + f"item {i}"), range(8)))
    assert all(r.status_code == 200 for r in responses)
    assert len({r.headers["x-sgl-moe-worker"] for r in responses}) == 1
    # A different prefix is balanced onto the other, idle worker.
    other = generate(router.url, unique_text(120))
    assert other.headers["x-sgl-moe-worker"] != responses[0].headers["x-sgl-moe-worker"]


def test_router_forwards_token_ids_and_responses_are_unchanged(cluster, router_factory):
    router = router_factory(cluster[:1])
    text = unique_text(30)
    body = {"text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0}
    via_router = httpx.post(f"{router.url}/generate", json=body, timeout=60).json()
    direct = httpx.post(f"{cluster[0].url}/generate", json=body, timeout=60).json()
    for key in ("text", "output_ids"):
        assert via_router[key] == direct[key]
    for key in ("input_token_logprobs", "output_token_logprobs", "output_top_logprobs", "prompt_tokens"):
        assert via_router["meta_info"][key] == direct["meta_info"][key], key


def test_streaming_is_passed_through(cluster, router_factory):
    router = router_factory(cluster[:1])
    body = {"text": unique_text(20), "sampling_params": {"max_new_tokens": 6, "temperature": 0}, "stream": True}
    chunks = []
    with httpx.stream("POST", f"{router.url}/generate", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data:"):
                chunks.append(line)
    assert chunks[-1] == "data: [DONE]" and len(chunks) >= 3
    body["stream"] = False
    final = httpx.post(f"{cluster[0].url}/generate", json=body, timeout=60).json()
    import json as _json

    assert _json.loads(chunks[-2][5:])["text"] == final["text"]


@pytest.mark.parametrize("path,body,status,needle", [
    ("/generate", b"{not json", 400, "JSON"),
    ("/generate", b'{"text": "hi", "bogus_field": 1}', 400, "bogus_field"),
    ("/generate", b'{"text": ""}', 400, "empty"),
    ("/v1/completions", b'{"model": "no-such-model", "prompt": "hi", "max_tokens": 1}', 404, "no-such-model"),
    ("/generate", ('{"text": "' + "word " * 5000 + '"}').encode(), 400, "context"),
    ("/v1/score", b'{"query": "q", "items": [], "label_token_ids": [5]}', 400, "items"),
])
def test_bad_input_gets_a_clear_4xx_and_is_not_a_worker_failure(cluster, router_factory, path, body, status,
                                                                  needle):
    router = router_factory(cluster[:1])
    resp = httpx.post(f"{router.url}{path}", content=body, headers={"content-type": "application/json"},
                      timeout=30)
    assert resp.status_code == status, resp.text
    assert needle.lower() in resp.json()["error"]["message"].lower()
    assert all(w["state"] == "healthy" and w["counters"]["failures"] == 0 for w in workers_state(router).values())
