"""Prefix caching and KV events from a real worker: cached tokens on a repeat, BlockStored hashes."""

import random
import time

import httpx
import msgspec
import zmq
from sglang.srt.disaggregation.kv_events import KVEventBatch

from sgl_moe.router.membership.kv_events import BlockStored, decode_frames
from sgl_moe.router.request.block_hash import block_hashes

_SGLANG_BATCH = msgspec.msgpack.Decoder(KVEventBatch)


def _fresh_prompt(seed, length):
    # Random ids in the ordinary-token range: never seen before, so nothing is cached yet.
    rng = random.Random(seed)
    return [rng.randrange(300, 4000) for _ in range(length)]


def _prefill(url, ids):
    resp = httpx.post(f"{url}/generate", timeout=120, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    assert resp.status_code == 200, resp.text
    return resp.json()["meta_info"]


def test_repeated_prompt_reports_cached_tokens(worker):
    ids = _fresh_prompt(1, 100)
    first = _prefill(worker.url, ids)
    second = _prefill(worker.url, ids)
    assert first["cached_tokens"] == 0
    # Page size 16: every full page of the prompt except the last token's is reused.
    assert second["cached_tokens"] == 96, second


def test_block_stored_event_hashes_equal_the_router_hashes(worker):
    endpoint = worker.info["kv_events"][0]
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.connect(endpoint["endpoint"])
    sub.setsockopt_string(zmq.SUBSCRIBE, endpoint["topic"])
    time.sleep(1.0)  # ZMQ slow joiner: let the subscription reach the publisher
    ids = _fresh_prompt(2, 70)
    expected = block_hashes(ids, 16)  # 4 full pages
    _prefill(worker.url, ids)

    stored = []
    deadline = time.time() + 20
    try:
        while time.time() < deadline and len(stored) < len(expected):
            if sub.poll(500):
                frames = sub.recv_multipart()
                _, batch = decode_frames(frames)
                sent = _SGLANG_BATCH.decode(frames[2]).events  # SGLang's own types: the token ids say whose
                for event, as_sent in zip(batch.events, sent, strict=True):
                    if isinstance(event, BlockStored) and set(as_sent.token_ids) <= set(ids):
                        stored.append((event, as_sent.token_ids))
    finally:
        sub.close(linger=0)
    hashes = [h for e, _ in stored for h in e.block_hashes]
    assert hashes[: len(expected)] == expected
    first, first_ids = stored[0]
    assert first.parent_block_hash is None and first.block_size == 16
    assert first_ids[:16] == ids[:16]
