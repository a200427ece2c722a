"""EventListener with CURVE keys against SGLang's real ZmqEventPublisher as the worker's CURVE patch builds it.

Each test checks one guarantee: the router's keys read the live stream and the replay buffer; a listener without
keys, with a client key the worker does not hold, or expecting another server key reads nothing at all.
"""

from __future__ import annotations

import asyncio
import atexit
import time
from pathlib import Path

import pytest
from sglang.srt.disaggregation import kv_events as sgl

from sgl_moe.kv_event_keys import ClientKeys, generate, load_client_keys
from sgl_moe.patches.kv_events_curve import publisher_class
from sgl_moe.router.membership.event_listener import EventListener, EventSource
from sgl_moe.router.membership.kv_events import BlockStored, EventBatch

TOKENS = [101, 202, 303, 404]


class Sink:
    def __init__(self) -> None:
        self.batches: list[EventBatch] = []

    def on_batch(self, source: EventSource, batch: EventBatch) -> None:
        self.batches.append(batch)

    def on_reset(self, source: EventSource, reason: str) -> None:
        pass


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("keys")
    generate(str(root / "deployment"))
    generate(str(root / "other"))  # a second deployment: keys the worker does not know
    return root


@pytest.fixture
def curve_publisher(keys):
    cls = publisher_class(str(keys / "deployment" / "worker"))
    pub = cls(attn_dp_rank=0, endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="kv",
              bind=True)
    atexit.unregister(pub.shutdown)
    yield pub
    pub.shutdown()


def _source(pub) -> EventSource:
    described = pub.describe_local_source(block_size=4)
    return EventSource(worker_id="w0", dp_rank=0, endpoint=described["endpoint"],
                       replay_endpoint=described["replay_endpoint"], topic="kv")


def _batch() -> sgl.KVEventBatch:
    return sgl.KVEventBatch(ts=time.time(), events=[sgl.BlockStored(
        block_hashes=[7], parent_block_hash=None, token_ids=TOKENS, block_size=4, lora_id=None, medium="GPU")])


async def _listen(pub, curve: ClientKeys | None, *, before: int, during_s: float) -> tuple[Sink, EventListener]:
    """Publish ``before`` batches, start a listener, publish one batch every 20 ms for ``during_s``."""
    for _ in range(before):
        pub.publish(_batch())
    await asyncio.sleep(0.2)  # the publisher thread has sent them into the replay buffer
    sink = Sink()
    listener = EventListener(_source(pub), sink, curve=curve, replay_timeout_s=0.5)
    task = asyncio.create_task(listener.run())
    deadline = time.monotonic() + during_s
    while time.monotonic() < deadline:
        pub.publish(_batch())
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    listener.stop()
    await asyncio.wait_for(task, 2.0)
    return sink, listener


def test_router_keys_read_replay_and_live_stream(curve_publisher, keys):
    curve = load_client_keys(str(keys / "deployment" / "router"))
    sink, listener = asyncio.run(_listen(curve_publisher, curve, before=5, during_s=3.0))  # 1.5 s failed under load
    seqs = [b.seq for b in sink.batches]
    assert seqs[:5] == [0, 1, 2, 3, 4]  # the connect-time replay brought what was published before
    assert seqs == list(range(len(seqs))) and len(seqs) > 10  # then the live stream, in order
    assert listener.stats.replays >= 1 and listener.stats.replay_failures == listener.stats.handshake_failures == 0
    stored = sink.batches[0].events[0]
    assert isinstance(stored, BlockStored) and stored.block_hashes == [7] and stored.block_size == 4


@pytest.mark.parametrize("who, hint", [
    ("no keys", "start the router with --kv-events-keys"),
    ("client key unknown to the worker", "put the router's router.key in the worker's"),
    ("wrong server key", "is not the worker.key in --kv-events-keys"),
])
def test_without_the_deployment_keys_nothing_is_read(curve_publisher, keys, who, hint, caplog):
    deployment, other = (load_client_keys(str(keys / d / "router")) for d in ("deployment", "other"))
    curve = {"no keys": None,
             "client key unknown to the worker": ClientKeys(other.public, other.secret, deployment.server),
             "wrong server key": ClientKeys(deployment.public, deployment.secret, other.server)}[who]
    sink, listener = asyncio.run(_listen(curve_publisher, curve, before=5, during_s=3.0))  # 1.5 s failed under load
    assert sink.batches == [] and listener.stats.batches == 0
    assert listener.stats.replays == 0 and listener.stats.replay_failures >= 1
    assert listener.stats.handshake_failures >= 1
    warnings = [r.getMessage() for r in caplog.records if "cannot read KV events" in r.getMessage()]
    # said once per kind of failed handshake (ZeroMQ may report a refusal as more than one kind), with what to fix
    assert any(hint in w for w in warnings) and len(warnings) == len(set(warnings)), warnings


def test_router_keys_against_a_plain_publisher_say_so(keys, caplog):
    pub = sgl.ZmqEventPublisher(attn_dp_rank=0, endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                                topic="kv", bind=True)
    atexit.unregister(pub.shutdown)
    try:
        curve = load_client_keys(str(keys / "deployment" / "router"))
        sink, listener = asyncio.run(_listen(pub, curve, before=1, during_s=2.0))  # a loaded CI machine is slow
    finally:
        pub.shutdown()
    assert sink.batches == [] and listener.stats.handshake_failures >= 1
    assert any("the publisher does not use CURVE" in r.getMessage() for r in caplog.records)
