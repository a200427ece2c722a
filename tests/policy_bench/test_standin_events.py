"""A stand-in worker's KV events (``StandInWorker(kv_events=True)``): what it publishes through SGLang's own
``ZmqEventPublisher``, read back with a plain ZMQ subscriber and the router's decoder."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request

import zmq

from sgl_moe.policy_bench.standin import PAGE, StandInFleet
from sgl_moe.router.membership.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, decode_frames
from sgl_moe.router.request.block_hash import block_hashes


def _post(url: str, path: str, body: dict | None = None) -> None:
    req = urllib.request.Request(url + path, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def _info(url: str) -> dict:
    with urllib.request.urlopen(url + "/sgl_moe/info", timeout=10) as resp:
        return json.loads(resp.read())


@contextlib.contextmanager
def _subscribed(pool_tokens: int, step_s: float):
    """One stand-in publishing KV events, its ``kv_events`` entry, and a plain ZMQ subscriber that has joined."""
    fleet = StandInFleet(1, pool_tokens, per_token_s=0.0, step_s=step_s, tokenize=False, kv_events=True).start()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        [worker] = fleet.workers
        [described] = _info(worker.url)["kv_events"]
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(described["endpoint"])
        time.sleep(0.3)  # PUB/SUB: a subscriber joins late (the router asks the replay socket; this test waits)
        yield worker, described, sub
    finally:
        sub.close(0)
        ctx.term()
        fleet.stop()


def test_stand_in_publishes_the_pages_it_stores_evicts_and_clears():
    """A cache of 4 pages: a 3-page prompt is stored whole; a second, different one evicts the 2 oldest pages
    first and stores its 3 (its partial last page is not a block); the first prompt again, its first page evicted,
    is stored whole; a flush clears everything. (The hashes are SGLang's page hashes of the ids sent: they say
    which tokens were stored.)"""
    with _subscribed(4 * PAGE, 0.0) as (worker, described, sub):
        assert described["dp_rank"] == 0 and described["replay_endpoint"] and described["topic"] == "kv"

        a = list(range(1000, 1000 + 3 * PAGE))
        b = list(range(5000, 5000 + 3 * PAGE + 5))
        ha, hb = block_hashes(a, PAGE), block_hashes(b, PAGE)
        _post(worker.url, "/generate", {"input_ids": a})
        _post(worker.url, "/generate", {"input_ids": b})
        _post(worker.url, "/generate", {"input_ids": a})  # a[0] still cached: a[1:] are stored again
        _post(worker.url, "/flush_cache")

        batches = []
        while len(batches) < 4 and sub.poll(5000):
            batches.append(decode_frames(sub.recv_multipart())[1])
        assert [b.seq for b in batches] == [0, 1, 2, 3]
        first, second, third, flushed = (b.events for b in batches)
        assert first == [BlockStored(block_hashes=ha, parent_block_hash=None, block_size=PAGE)]
        assert second == [BlockRemoved(block_hashes=ha[:2]),
                          BlockStored(block_hashes=hb, parent_block_hash=None, block_size=PAGE)]
        # the cache held ha[2], hb[0..2]; a's lookup stops at ha[0] (evicted): all 3 pages are stored (ha[2] again,
        # now the youngest), and room for the 2 new ones evicts the 2 oldest, hb[0] and hb[1]
        assert third == [BlockRemoved(block_hashes=[hb[0], hb[1]]),
                         BlockStored(block_hashes=ha, parent_block_hash=None, block_size=PAGE)]
        assert flushed == [AllBlocksCleared()]


def test_events_made_while_a_batch_runs_are_published_together_when_it_ends():
    """As SGLang publishes once per prefill batch: the first prompt reaches an idle stand-in and its pages are
    published at once; two more arrive while its batch computes, and theirs come in one batch when it ends."""
    import threading

    with _subscribed(64 * PAGE, 0.4) as (worker, _, sub):

        a, b, c = (list(range(k, k + 2 * PAGE)) for k in (1000, 5000, 9000))
        first = threading.Thread(target=_post, args=(worker.url, "/generate", {"input_ids": a}))
        first.start()
        time.sleep(0.15)  # a's batch is computing
        others = [threading.Thread(target=_post, args=(worker.url, "/generate", {"input_ids": ids})) for ids in (b, c)]
        for t in others:
            t.start()
        for t in (first, *others):
            t.join(10)

        batches = []
        while len(batches) < 3 and sub.poll(1500):
            batches.append(decode_frames(sub.recv_multipart())[1])
        assert [b.seq for b in batches] == [0, 1]
        assert batches[0].events == [BlockStored(block_hashes=block_hashes(a, PAGE), parent_block_hash=None,
                                                 block_size=PAGE)]
        stored = sorted(tuple(e.block_hashes) for e in batches[1].events)
        assert stored == sorted(tuple(block_hashes(ids, PAGE)) for ids in (b, c))
