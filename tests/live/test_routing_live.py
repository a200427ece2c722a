"""The router in front of real SGLang workers: hashing, tables (cache flush, removal, lost events), placement,
admission under Θ, spill, worker failures, API behaviour."""

import concurrent.futures as cf
import json
import os
import signal
import threading
import time
import uuid
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from sgl_moe.harness.router_client import generate, wait_until
from sgl_moe.harness.router_client import metric as _metric
from sgl_moe.harness.router_client import workers as _workers
from sgl_moe.policy_bench.routers import flush_caches

from .conftest import NO_THETA_PROFILE, start_side_by_side


def workers_state(router):
    return _workers(router.url)


def metric(router, name, **labels):
    return _metric(router.url, name, **labels)


def unique_text(words: int = 60) -> str:
    """Text no earlier test sent, so cache state from other tests cannot leak in."""
    tag = uuid.uuid4().hex
    return f"# {tag}\n" + " ".join(f"value_{tag[i % 32]}{i}" for i in range(words)) + "\n"


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
    # Θ pinned well above the burst: each worker measures its own Θ, and one whose profile found its knee at 16
    # requests (1.4e10 FLOPs, under the burst's 1.8e10) rightly spills the last of the burst to the idle worker.
    router = router_factory(cluster, "--saturation-flops", "1e12")
    prefix = unique_text(120)
    with cf.ThreadPoolExecutor(9) as pool:
        # A few decode steps keep the burst in flight long enough to be seen (one-token prefills of the tiny
        # model can all finish before the first poll of /workers on a warm machine).
        burst = [pool.submit(generate, router.url, prefix + f"item {i}", 32) for i in range(8)]
        # While the burst runs, a different prefix is balanced onto the other, idle worker.
        busy = wait_until(lambda: [w for w, s in workers_state(router).items() if s["inflight_requests"]],
                          what="burst in flight")
        other = pool.submit(generate, router.url, unique_text(120)).result()
        responses = [f.result() for f in burst]
    assert all(r.status_code == 200 for r in responses)
    assert {r.headers["x-sgl-moe-worker"] for r in responses} == set(busy)
    assert other.headers["x-sgl-moe-worker"] not in busy


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


def by_url(router):
    return {w["url"]: w for w in workers_state(router).values()}


def test_all_blocks_cleared_purges_the_committed_table(cluster, router_factory):
    router = router_factory(cluster[:1])
    generate(router.url, unique_text(80))
    wait_until(lambda: by_url(router)[cluster[0].url]["committed_blocks"] > 0, what="blocks committed")
    # SGLang answers 400 while a request is still running (another test's, on this shared worker): retried until idle.
    flush_caches([cluster[0].url])
    wait_until(lambda: by_url(router)[cluster[0].url]["committed_blocks"] == 0, what="table purged")
    assert metric(router, "kv_events_blocks", type="all_cleared") >= 1


def test_removed_worker_leaves_no_state_and_can_rejoin(cluster, router_factory):
    router = router_factory(cluster)
    text = unique_text(80)
    first = generate(router.url, text)
    wid = first.headers["x-sgl-moe-worker"]
    url = workers_state(router)[wid]["url"]
    wait_until(lambda: workers_state(router)[wid]["committed_blocks"] > 0, what="blocks committed")
    assert httpx.delete(f"{router.url}/workers/{wid}", timeout=10).json()["removed"] == wid
    assert wid not in workers_state(router)
    assert f'worker="{wid}"' not in httpx.get(f"{router.url}/metrics", timeout=10).text
    # Without it the prefix has no home: the request runs elsewhere and is predicted uncached.
    again = generate(router.url, text)
    assert again.headers["x-sgl-moe-worker"] != wid and again.headers["x-sgl-moe-predicted-cached-tokens"] == "0"
    assert httpx.delete(f"{router.url}/workers/{wid}", timeout=10).status_code == 404
    # Re-added, it rebuilds its table from the worker's replay buffer (its cache still holds the prefix).
    added = httpx.post(f"{router.url}/workers", json={"url": url}, timeout=30)
    assert added.status_code == 201, added.text
    new_id = added.json()["id"]
    wait_until(lambda: workers_state(router)[new_id]["committed_blocks"] > 0, what="replayed table")
    assert httpx.post(f"{router.url}/workers", json={"url": url}, timeout=30).status_code == 409


def test_a_worker_removed_while_it_runs_a_request_answers_it_and_the_queue_moves_on(cluster, router_factory):
    """DELETE /workers/{id} while that worker runs a request and others wait in the queue: the running request is
    answered by the removed worker (the router passes its answer on), the queued ones run on the worker left, and
    nothing of the removed worker stays in the router's tables or counts."""
    router = router_factory(cluster, "--saturation-flops", "1000")  # one request at a time per worker
    texts = [unique_text(300) for _ in range(4)]
    start = threading.Barrier(len(texts))
    answered_at: dict[str, float] = {}

    def send(text: str) -> httpx.Response:
        start.wait(30)
        resp = generate(router.url, text)
        answered_at[text] = time.monotonic()
        return resp

    with cf.ThreadPoolExecutor(len(texts)) as pool:
        futures = [pool.submit(send, t) for t in texts]
        # The worker is read from the snapshot that showed it busy: a second read could find its request done.
        wid = wait_until(lambda: next((k for k, w in workers_state(router).items() if w["inflight_requests"]), None),
                         what="a request running")
        removed = httpx.delete(f"{router.url}/workers/{wid}", timeout=10)
        removed_at = time.monotonic()
        responses = [f.result(300) for f in futures]
    assert removed.json()["removed"] == wid
    assert [r.status_code for r in responses] == [200] * 4, [r.text[:200] for r in responses]
    by_removed = [t for t, r in zip(texts, responses) if r.headers["x-sgl-moe-worker"] == wid]
    assert by_removed and any(answered_at[t] > removed_at for t in by_removed), "the request ended before the DELETE"
    assert wid not in workers_state(router)
    # (a promise retires when its worker's BlockStored events arrive, just after the answer)
    wait_until(lambda: all(w["inflight_requests"] == 0 and w["inflight_flops"] == 0 and w["pending_blocks"] == 0
                           for w in workers_state(router).values()), what="the worker left idle, nothing pending")
    assert metric(router, "queued_requests") >= 1
    again = generate(router.url, texts[0])
    assert again.status_code == 200 and again.headers["x-sgl-moe-worker"] != wid


def test_lost_event_batches_are_recovered_through_replay(cluster, router_factory):
    probe = router_factory(cluster[:1])
    # The probe's connect-time replay must be over before its last sequence number is the worker's.
    wait_until(lambda: workers_state(probe)["w0"]["events"][0]["replays"] >= 1, what="connect replay")
    last = workers_state(probe)["w0"]["events"][0]["last_seq"]
    probe.stop()
    # The router drops the next two live batches on receipt, as a lossy network would.
    router = router_factory(cluster[:1], "--debug-drop-event-seqs", f"{last + 1},{last + 2}")
    texts = [unique_text(50) for _ in range(3)]
    for t in texts:
        generate(router.url, t)
    wait_until(lambda: metric(router, "kv_event_gaps") >= 1, what="gap detected")
    wait_until(lambda: metric(router, "kv_event_replays") >= 2, what="gap replayed")  # after the connect replay
    # Every block the worker stored is known: each prompt is predicted exactly as the worker reports.
    for t in texts:
        resp = generate(router.url, t + " tail")
        assert int(resp.headers["x-sgl-moe-predicted-cached-tokens"]) == resp.json()["meta_info"]["cached_tokens"] > 0


def test_saturated_workers_queue_requests_and_lose_none(cluster, router_factory):
    # Θ far below one request's cost: each worker runs one request at a time, the rest wait in the queue. The ten
    # are sent at one instant (a barrier) and are long enough to overlap: sent as the pool's threads came up, on a
    # loaded CI host some arrived after earlier ones had finished, and only 4 queued.
    router = router_factory(cluster, "--saturation-flops", "1000")
    texts = [unique_text(300) for _ in range(10)]
    start = threading.Barrier(len(texts))

    def send(text: str) -> httpx.Response:
        start.wait(30)
        return generate(router.url, text)

    with cf.ThreadPoolExecutor(len(texts)) as pool:
        responses = list(pool.map(send, texts))
    assert [r.status_code for r in responses] == [200] * 10
    state = workers_state(router)
    assert all(w["peak_inflight_requests"] == 1 for w in state.values()), state
    assert sum(w["counters"]["requests"] for w in state.values()) == 10
    assert all(w["inflight_flops"] == 0 and w["inflight_requests"] == 0 for w in state.values())
    assert metric(router, "queued_requests") >= 5
    assert max(float(r.headers["x-sgl-moe-queue-ms"]) for r in responses) > 0


def test_full_queue_answers_429_with_retry_after(cluster, router_factory):
    router = router_factory(cluster[:1], "--saturation-flops", "1000", "--queue-size", "1")
    texts = [unique_text(400) for _ in range(8)]
    with cf.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda t: generate(router.url, t), texts))
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 429 in codes and set(codes) <= {200, 429}
    rejected = next(r for r in responses if r.status_code == 429)
    assert int(rejected.headers["retry-after"]) >= 1 and "queue" in rejected.json()["error"]["message"]


def test_hot_prefix_spills_to_the_other_worker(cluster, router_factory):
    # Short shared prefix, long distinct suffixes: waiting behind the hot worker costs more than
    # recomputing the prefix on the idle one.
    prefix = unique_text(20)
    router = router_factory(cluster, "--saturation-flops", "1000", "--max-affinity-wait-s", "60")
    with cf.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda i: generate(router.url, prefix + unique_text(200)), range(6)))
    assert all(r.status_code == 200 for r in responses)
    assert len({r.headers["x-sgl-moe-worker"] for r in responses}) == 2
    assert metric(router, "spills") >= 1


class _FakeInfoWorker(BaseHTTPRequestHandler):
    """Serves a real worker's /sgl_moe/info with one field changed (isolates the discovery check)."""

    info: dict = {}

    def do_GET(self):  # noqa: N802
        body = json.dumps(self.info).encode()
        self.send_response(200 if self.path == "/sgl_moe/info" else 404)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("change,needle", [({"page_size": 32}, "page size"), ({"model_name": "other"}, "model")])
def test_incompatible_worker_is_refused(cluster, router_factory, change, needle):
    router = router_factory(cluster[:1])
    handler = type("H", (_FakeInfoWorker,), {"info": {**cluster[0].info, **change, "kv_events": []}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        resp = httpx.post(f"{router.url}/workers", json={"url": f"http://127.0.0.1:{server.server_port}"},
                          timeout=10)
    finally:
        server.shutdown()
    assert resp.status_code == 409 and needle in resp.json()["error"]["message"]
    assert len(workers_state(router)) == 1


def test_worker_killed_mid_request(cluster, router_factory):
    """A worker that dies mid-request (killed from outside, as an OOM or a reboot would): the router cannot tell a
    kill from a request that crashed it, so both requests running on it become suspects and are retried by the
    router itself, one at a time and each alone on the surviving worker (the quarantine lane); both survive, so
    both clients get their answer and the same request sent again is served (issue 29: innocent requests were
    refused for an hour). The dead worker leaves rotation, and comes back (with an empty table) when restarted.

    The victim is the cluster's second worker, restarted as it was (its flags, its port): a restart is a fresh
    process, so the cluster is whole again for the tests after this one and no worker starts for this test alone
    (it started one, ~45 s, and then restarted that). Θ is pinned far above both requests: this test is about a
    death, not admission (a Θ profiled on a loaded host can be one request, and the second would then wait for the
    first to finish); the cluster's workers skip the start-up Θ profile, and so does the restart."""
    victim = cluster[1]
    assert NO_THETA_PROFILE in victim.args
    # Its earlier tests' blocks leave its cache (and, through the replayed events, the router's table), so the
    # blocks awaited below are the prefix's, as on a fresh worker.
    flush_caches([victim.url])
    router = router_factory([cluster[0], victim], "--health-interval-s", "0.5", "--saturation-flops", "1e15")
    vid = by_url(router)[victim.url]["id"]
    try:
        # The connect-time replay brings the earlier blocks and then the flush: until it has ended, blocks counted
        # may be those, not the prefix's. (CI once saw the second request reach the victim only after the first had
        # finished, as a request held on the first's promised prefix blocks would: this wait rules that out.)
        wait_until(lambda: workers_state(router)[vid]["events"][0]["replays"] >= 1, what="connect replay")
        before = workers_state(router)[vid]["committed_blocks"]
        prefix = unique_text(40)
        httpx.post(f"{victim.url}/generate", json={"text": prefix, "sampling_params": {"max_new_tokens": 1}},
                   timeout=60)  # the prefix lives on the victim only: the router sends its requests there
        wait_until(lambda: workers_state(router)[vid]["committed_blocks"] > before, what="victim blocks")
        long_suffix = unique_text(500)
        with cf.ThreadPoolExecutor(2) as pool:
            prefill = pool.submit(generate, router.url, prefix + long_suffix)
            # Its own suffix: a request sharing the prefill's still-uncommitted blocks would wait for them.
            decode = pool.submit(generate, router.url, prefix + unique_text(500), 200)
            wait_until(lambda: workers_state(router)[vid]["inflight_requests"] == 2 or prefill.done()
                       or decode.done(), what="both in flight")
            assert not prefill.done() and not decode.done(), (prefill.result().text, decode.result().text)
            os.killpg(victim.proc.pid, signal.SIGKILL)  # the whole worker: server, scheduler, detokenizer
            victim.proc.wait(10)
            prefill, decode = prefill.result(), decode.result()
        for answer in (prefill, decode):
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-sgl-moe-worker"] != vid
        assert metric(router, "quarantine_runs") == 2 and metric(router, "suspects_cleared") == 2
        assert metric(router, "poison_convicted") == 0
        again = generate(router.url, prefix + long_suffix)
        assert again.status_code == 200, again.text
        wait_until(lambda: workers_state(router)[vid]["state"] == "unhealthy", what="out of rotation")
    finally:
        # Restarted on the same port, whatever failed above (the cluster serves later tests).
        if victim.proc.poll() is not None:
            restarted = replace(victim, log_path=victim.log_path.with_name(f"{victim.log_path.stem}-restart.log"),
                                proc=None)
            cluster[1] = start_side_by_side({"victim": restarted})["victim"]
    # Back in rotation; the restart is detected and the old table dropped (the new instance's own blocks, e.g. from
    # SGLang's warm-up request, arrive through its events).
    state = wait_until(lambda: (s := workers_state(router)[vid])["state"] == "healthy" and s, timeout=30,
                       what="back in rotation")
    assert state["counters"]["restarts"] == 1
    assert state["events"][0]["resets"] >= 2  # on connect, and when the publisher restarted
