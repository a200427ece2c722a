"""EventListener against SGLang's real ZmqEventPublisher on loopback ports."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

import msgspec
import pytest
import zmq
import zmq.asyncio
from sglang.srt.disaggregation import kv_events as sgl

from sgl_moe.router.membership.event_listener import EventListener, EventSource
from sgl_moe.router.membership.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch


class RecordingSink:
    """Records every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, EventBatch | str]] = []

    def on_batch(self, source: EventSource, batch: EventBatch) -> None:
        self.calls.append(("batch", batch))

    def on_reset(self, source: EventSource, reason: str) -> None:
        self.calls.append(("reset", reason))

    def resets(self) -> list[str]:
        return [reason for kind, reason in self.calls if kind == "reset"]

    def seqs_since_reset(self) -> list[int]:
        """Sequence numbers delivered since the last reset: what the sink's table is built from."""
        seqs: list[int] = []
        for kind, item in self.calls:
            seqs = [] if kind == "reset" else [*seqs, item.seq]
        return seqs

    def batches(self) -> list[EventBatch]:
        return [item for kind, item in self.calls if kind == "batch"]


def _sgl_events(i: int) -> list:
    """Events of the i-th test batch, as SGLang builds them."""
    events = [sgl.BlockStored(block_hashes=[10 * i, -10 * i - 1], parent_block_hash=i or None,
                              token_ids=list(range(i, i + 8)), block_size=4, lora_id=None, medium="GPU")]
    if i % 3 == 1:
        events.append(sgl.BlockRemoved(block_hashes=[10 * i - 10], medium="GPU"))
    if i % 7 == 6:
        events.append(sgl.AllBlocksCleared())
    return events


def _expected_events(i: int) -> list:
    """The same events as the router decodes them."""
    events: list = [BlockStored(block_hashes=[10 * i, -10 * i - 1], parent_block_hash=i or None,
                                block_size=4, lora_id=None, medium="GPU")]
    if i % 3 == 1:
        events.append(BlockRemoved(block_hashes=[10 * i - 10], medium="GPU"))
    if i % 7 == 6:
        events.append(AllBlocksCleared())
    return events


def _batch(i: int) -> sgl.KVEventBatch:
    return sgl.KVEventBatch(ts=time.time(), events=_sgl_events(i))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture
def publisher() -> Iterator[Callable[..., sgl.ZmqEventPublisher]]:
    """Factory of real SGLang publishers bound on loopback; all shut down at teardown."""
    started: list[sgl.ZmqEventPublisher] = []

    def start(*, replay: bool = True, buffer_steps: int = 1000, like: sgl.ZmqEventPublisher | None = None
              ) -> sgl.ZmqEventPublisher:
        if like is None:
            endpoint, replay_endpoint = "tcp://127.0.0.1:*", "tcp://127.0.0.1:*" if replay else None
        else:  # same ports as a publisher just shut down: wait for its sockets to let go of them
            endpoint, replay_endpoint = _source(like).endpoint, _source(like).replay_endpoint
            ports = [int(e.rsplit(":", 1)[1]) for e in (endpoint, replay_endpoint) if e]
            deadline = time.monotonic() + 5
            while not all(_port_is_free(p) for p in ports):
                assert time.monotonic() < deadline, f"ports {ports} stay busy"
                time.sleep(0.02)
        pub = sgl.ZmqEventPublisher(attn_dp_rank=0, endpoint=endpoint, replay_endpoint=replay_endpoint,
                                    buffer_steps=buffer_steps, topic="kv", bind=True)
        # Its atexit hook on an already shut-down publisher waits out a 1 s timeout: drop it.
        atexit.unregister(pub.shutdown)
        started.append(pub)
        return pub

    yield start
    for pub in started:
        if pub._running:  # a second shutdown() would wait out its 1 s timeout
            pub.shutdown()


def _source(pub: sgl.ZmqEventPublisher, **overrides: str | None) -> EventSource:
    described = pub.describe_local_source(block_size=4)
    assert described is not None
    fields = {"endpoint": described["endpoint"], "replay_endpoint": described.get("replay_endpoint"),
              "topic": described["topic"], **overrides}
    return EventSource(worker_id="w0", dp_rank=described["dp_rank"], **fields)


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for a condition"
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _listening(source: EventSource, sink: RecordingSink, **kwargs: object) -> AsyncIterator[EventListener]:
    """Runs a listener until the block ends, then checks that stop() ends it promptly."""
    listener = EventListener(source, sink, **kwargs)  # type: ignore[arg-type]
    task = asyncio.create_task(listener.run())
    await _until(lambda: listener.stats.resets >= 1)  # connected
    try:
        yield listener
    finally:
        listener.stop()
        await asyncio.wait_for(task, 1.0)


async def _warm_up(pub: sgl.ZmqEventPublisher, listener: EventListener, limit: int) -> int:
    """Publish batches until one arrives live (PUB/SUB drops what is sent before the subscription
    is in place); returns how many were published. Call after the connect-time replay."""
    for published in range(1, limit + 1):
        pub.publish(_batch(published - 1))
        with contextlib.suppress(AssertionError):
            await _until(lambda published=published: listener.stats.last_seq == published - 1, timeout_s=0.2)
            return published
    raise AssertionError(f"nothing arrived live in {limit} batches")


def _assert_exact(sink: RecordingSink, seqs: range) -> None:
    assert sink.seqs_since_reset() == list(seqs)
    by_seq = {b.seq: b for b in sink.batches()}
    for seq in seqs:
        assert by_seq[seq].events == _expected_events(seq)
        assert by_seq[seq].dp_rank == 0


def test_in_order_delivery_with_exact_events(publisher):
    pub, sink = publisher(), RecordingSink()

    async def body() -> EventListener:
        async with _listening(_source(pub), sink) as listener:
            await _until(lambda: listener.stats.replays == 1)
            n = 40
            for i in range(await _warm_up(pub, listener, limit=n), n):
                pub.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == n - 1)
            return listener

    listener = asyncio.run(body())
    _assert_exact(sink, range(40))
    assert sink.resets() == ["connected: starting from an empty table"]
    stats = listener.stats
    assert stats.batches == 40 and stats.events == sum(len(_expected_events(i)) for i in range(40))
    assert stats.replay_failures == stats.decode_errors == 0 and stats.resets == 1
    assert 0 <= stats.last_lag_s < 5 and stats.connected_at > 0


def test_a_backlog_is_delivered_in_chunks_while_other_tasks_keep_the_loop_busy(publisher):
    """Batches that have piled up are read and delivered up to ``_CHUNK`` a turn of the event loop, not one: on a
    busy router (every turn full of requests, each finished request a batch from its worker) one batch a turn fell
    behind, 2.3 s at 700 requests/s, and the tables with it. Here 600 batches are published while the loop is
    blocked, then another task takes a turn each time it runs: between two of its turns the listener delivers many
    batches at once (one at most before), and delivers them all, in order."""
    pub, sink = publisher(), RecordingSink()

    async def body() -> list[int]:
        async with _listening(_source(pub), sink) as listener:
            await _until(lambda: listener.stats.replays == 1)
            first = await _warm_up(pub, listener, limit=40)
            n = first + 600
            busy = asyncio.Event()
            per_turn: list[int] = []

            async def other_requests() -> None:
                await busy.wait()
                seen = len(sink.calls)
                while True:
                    await asyncio.sleep(0)
                    per_turn.append(len(sink.calls) - seen)
                    seen = len(sink.calls)

            ticker = asyncio.create_task(other_requests())
            for i in range(first, n):
                pub.publish(_batch(i))
            deadline = time.monotonic() + 10  # the loop blocked while the publisher's thread sends them all
            while not pub._event_queue.empty() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)
            busy.set()
            await _until(lambda: listener.stats.last_seq == n - 1, timeout_s=30)
            ticker.cancel()
            _assert_exact(sink, range(n))
            return per_turn

    per_turn = asyncio.run(body())
    assert max(per_turn) >= 50, f"at most {max(per_turn)} batches delivered between two turns of another task"


def test_connect_replay_rebuilds_state_published_before_connecting(publisher, caplog):
    pub, sink = publisher(), RecordingSink()
    for i in range(10):
        pub.publish(_batch(i))

    async def body() -> EventListener:
        await _until(lambda: len(pub._buffer) == 10)  # all 10 sent before the listener exists
        async with _listening(_source(pub), sink) as listener:
            for i in range(10, 20):  # live batches racing the connect-time replay
                pub.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == 19)
            return listener

    with caplog.at_level(logging.INFO, logger="sgl_moe.router.events"):
        listener = asyncio.run(body())
    _assert_exact(sink, range(20))
    assert listener.stats.batches == 20 and listener.stats.replays >= 1 and listener.stats.resets == 1
    assert any("w0 rank 0: replayed" in r.getMessage() for r in caplog.records)


def test_gap_is_recovered_by_replay_without_duplicates(publisher):
    pub, sink = publisher(), RecordingSink()

    async def body() -> EventListener:
        async with _listening(_source(pub), sink, drop_seqs=frozenset({12, 15, 16})) as listener:
            await _until(lambda: listener.stats.replays == 1)
            for i in range(await _warm_up(pub, listener, limit=10), 14):
                pub.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == 13)
            for i in range(14, 20):
                pub.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == 19)
            return listener

    listener = asyncio.run(body())
    _assert_exact(sink, range(20))
    assert listener.stats.batches == 20
    assert listener.stats.gaps == 2 and listener.stats.replays == 3  # one at connect, one per gap
    assert listener.stats.replay_failures == 0 and listener.stats.resets == 1


def test_gap_beyond_the_replay_buffer_resets_and_continues(publisher):
    pub, sink = publisher(buffer_steps=3), RecordingSink()

    async def body() -> EventListener:
        async with _listening(_source(pub), sink, drop_seqs=frozenset(range(12, 19))) as listener:
            await _until(lambda: listener.stats.replays == 1)
            for i in range(await _warm_up(pub, listener, limit=10), 22):
                pub.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == 21)
            return listener

    listener = asyncio.run(body())
    connected, lost = sink.resets()
    assert lost.startswith("lost seq 12..18 and could not replay them: the replay buffer starts at seq ")
    seqs = sink.seqs_since_reset()
    assert seqs == list(range(seqs[0], 22)) and 16 <= seqs[0] <= 19  # what the 3-batch buffer still held
    assert listener.stats.replay_failures == 1 and listener.stats.resets == 2


def test_gap_without_replay_endpoint_resets_and_continues(publisher):
    pub, sink = publisher(replay=False), RecordingSink()

    async def body() -> EventListener:
        async with _listening(_source(pub), sink, drop_seqs=frozenset({12})) as listener:
            for i in range(await _warm_up(pub, listener, limit=10), 15):
                pub.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == 14)
            return listener

    listener = asyncio.run(body())
    assert sink.resets()[-1] == "lost seq 12..12 and could not replay them: the publisher has no replay endpoint"
    _assert_exact(sink, range(13, 15))
    assert listener.stats.replay_failures >= 1 and listener.stats.gaps >= 1


def test_dead_replay_endpoint_times_out_and_live_delivery_goes_on(publisher):
    pub, sink = publisher(replay=False), RecordingSink()
    dead = f"tcp://127.0.0.1:{_free_port()}"

    async def body() -> EventListener:
        async with _listening(_source(pub, replay_endpoint=dead), sink, replay_timeout_s=0.2) as listener:
            await _until(lambda: listener.stats.replay_failures == 1)
            published = await _warm_up(pub, listener, limit=10)
            for i in range(published, published + 5):
                pub.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == published + 4)
            return listener

    listener = asyncio.run(body())
    seqs = sink.seqs_since_reset()
    assert seqs == list(range(seqs[0], seqs[-1] + 1))
    assert listener.stats.replays == 0 and listener.stats.replay_failures >= 1


def test_a_dead_replay_endpoint_times_out_while_live_batches_keep_coming(publisher):
    """The replay's silence is the replay endpoint's alone: live batches arriving meanwhile (a busy worker publishes
    every few milliseconds) are queued, and do not keep the wait for a dead endpoint going. Before, any live batch
    woke the replay's poll as an answer would, so a dead endpoint was waited for as long as the worker published,
    and the table stayed as it was (empty at connect) all that time."""
    pub, sink = publisher(replay=False), RecordingSink()
    dead = f"tcp://127.0.0.1:{_free_port()}"

    async def body() -> EventListener:
        async with _listening(_source(pub, replay_endpoint=dead), sink, replay_timeout_s=0.3) as listener:
            t0, i = time.monotonic(), 0
            while listener.stats.replay_failures == 0:
                assert time.monotonic() - t0 < 3.0, "the replay of a dead endpoint never timed out"
                pub.publish(_batch(i))
                i += 1
                await asyncio.sleep(0.02)
            for j in range(i, i + 5):
                pub.publish(_batch(j))
            await _until(lambda: listener.stats.last_seq == i + 4)
            return listener

    listener = asyncio.run(body())
    seqs = sink.seqs_since_reset()
    assert seqs == list(range(seqs[0], seqs[-1] + 1))
    assert listener.stats.replays == 0 and listener.stats.replay_failures >= 1  # (the first live batch is a gap)


@pytest.mark.parametrize("replay", [True, False], ids=["with-replay", "without-replay"])
def test_publisher_restart_resets_then_delivers_the_new_stream(publisher, replay):
    first, sink = publisher(replay=replay), RecordingSink()
    # The restarted publisher counts from 0 again; the listener's SUB needs a moment to reconnect, and
    # whatever the new publisher sends before that is lost. The old stream is long enough for the first
    # batch seen from the new one to have a smaller seq than the last one delivered.
    old_batches = 40

    async def body() -> tuple[EventListener, int]:
        async with _listening(_source(first), sink) as listener:
            for i in range(await _warm_up(first, listener, limit=10), old_batches):
                first.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == old_batches - 1)
            first.shutdown()
            second = publisher(replay=replay, like=first)
            published = 0
            while len(sink.resets()) < 2:
                assert published < old_batches, "restart not detected"
                second.publish(_batch(published))
                published += 1
                await asyncio.sleep(0.02)
            for i in range(published, published + 3):
                second.publish(_batch(i))
            await _until(lambda: listener.stats.last_seq == published + 2)
            return listener, published + 3

    listener, total = asyncio.run(body())
    connected, restarted = sink.resets()
    assert restarted.startswith("publisher restarted (seq went from 39 to ")
    if replay:  # the new publisher's whole stream, including what it sent before the listener reconnected
        _assert_exact(sink, range(total))
    else:
        seqs = sink.seqs_since_reset()
        assert seqs == list(range(seqs[0], total))
    assert listener.stats.resets == 2


def test_restart_seen_as_a_gap_is_caught_by_checking_the_last_batch(publisher):
    first, sink = publisher(), RecordingSink()
    for i in range(3):
        first.publish(_batch(i))

    async def body() -> tuple[EventListener, int]:
        await _until(lambda: len(first._buffer) == 3)
        # Seqs 0..3 are dropped live: the old stream arrives by the connect-time replay only, and the new
        # one first shows up live as seq 4 or later, a gap, not a step back.
        async with _listening(_source(first), sink, drop_seqs=frozenset(range(4))) as listener:
            await _until(lambda: listener.stats.last_seq == 2)
            first.shutdown()
            second = publisher(like=first)
            published = 0
            while len(sink.resets()) < 2:
                assert published < 100, "restart not detected"
                second.publish(_batch(published))
                published += 1
                await asyncio.sleep(0.02)
            await _until(lambda: listener.stats.last_seq >= published - 1)
            return listener, published

    listener, total = asyncio.run(body())
    assert sink.resets()[1] == "publisher restarted (it replays a different batch as seq 2)"
    _assert_exact(sink, range(total))
    assert listener.stats.gaps == 1 and listener.stats.resets == 2 and listener.stats.replay_failures == 0


@pytest.mark.parametrize("fault", ["skip", "garbage"])
def test_incomplete_replay_answers(fault):
    """A scripted replay endpoint in place of SGLang's: its ROUTER drops replies silently once the pipe to a
    client is full, so an answer can skip batches (the rest is asked for again); a malformed one is not
    retried past the point it breaks."""
    ctx = zmq.asyncio.Context()
    payloads = [msgspec.msgpack.encode(sgl.KVEventBatch(ts=time.time(), events=_sgl_events(i), attn_dp_rank=0))
                for i in range(10)]
    requests: list[int] = []
    sink = RecordingSink()

    async def serve(router: zmq.asyncio.Socket) -> None:
        while True:
            client, _, start = await router.recv_multipart()
            requests.append(int.from_bytes(start, "big"))
            for seq in range(requests[-1], 10):
                if fault == "skip" and len(requests) == 1 and seq in (4, 5):
                    continue
                payload = b"\xc1 garbage" if fault == "garbage" and seq == 5 else payloads[seq]
                await router.send_multipart([client, b"", b"kv", seq.to_bytes(8, "big"), payload])
            await router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    async def body() -> EventListener:
        pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        server = asyncio.create_task(serve(router))
        try:
            pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
            replay_port = router.bind_to_random_port("tcp://127.0.0.1")
            source = EventSource("w0", 0, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", "kv")
            async with _listening(source, sink) as listener:
                await _until(lambda: listener.stats.replays + listener.stats.replay_failures == 1)
                return listener
        finally:
            server.cancel()
            pub.close(linger=0)
            router.close(linger=0)

    try:
        listener = asyncio.run(body())
    finally:
        ctx.term()
    if fault == "skip":
        assert requests == [0, 4]
        _assert_exact(sink, range(10))
        assert listener.stats.replays == 1 and listener.stats.replay_failures == 0
    else:
        assert requests == [0, 5]
        _assert_exact(sink, range(5))  # what came before the broken message
        assert listener.stats.replay_failures == 1 and listener.stats.decode_errors == 2
    assert listener.stats.resets == 1  # the table was empty: nothing to reset


def test_malformed_and_foreign_messages_are_counted_and_skipped():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sink = RecordingSink()
    good = msgspec.msgpack.encode(sgl.KVEventBatch(ts=time.time(), events=_sgl_events(0), attn_dp_rank=0))
    seq0 = (0).to_bytes(8, "big")

    async def body() -> EventListener:
        source = EventSource("w0", 0, f"tcp://127.0.0.1:{port}", None, topic="kv")
        async with _listening(source, sink) as listener:
            while listener.stats.decode_errors == 0:  # until the subscription is in place
                pub.send_multipart([b"kv", seq0, b"\xc1 not msgpack"])
                await asyncio.sleep(0.01)
            warm_up = listener.stats.decode_errors
            pub.send_multipart([b"kv", b"short", good])  # sequence frame not 8 bytes
            pub.send_multipart([b"kv", good])  # two frames
            pub.send_multipart([b"kv", (-3).to_bytes(8, "big", signed=True), good])  # negative seq
            pub.send_multipart([b"kv", seq0, msgspec.msgpack.encode({"not": "a batch"})])
            pub.send_multipart([b"kv-other", seq0, good])  # prefix-matches the subscription; other topic
            pub.send_multipart([b"kv", seq0, good])
            await _until(lambda: listener.stats.batches == 1)
            assert listener.stats.decode_errors == warm_up + 4
            return listener

    try:
        listener = asyncio.run(body())
    finally:
        pub.close()
        ctx.term()
    assert [b.events for b in sink.batches()] == [_expected_events(0)]
    assert listener.stats.gaps == listener.stats.resets - 1 == 0


def test_stop_returns_promptly_even_during_a_replay():
    sink = RecordingSink()
    dead = f"tcp://127.0.0.1:{_free_port()}"
    source = EventSource("w0", 0, f"tcp://127.0.0.1:{_free_port()}", dead)

    async def body() -> None:
        listener = EventListener(source, sink, replay_timeout_s=60)
        task = asyncio.create_task(listener.run())
        await _until(lambda: listener.stats.resets == 1)  # now waiting on the dead replay endpoint
        await asyncio.sleep(0.05)
        started = time.monotonic()
        listener.stop()
        await asyncio.wait_for(task, 1.0)
        assert time.monotonic() - started < 0.5
        assert listener.stats.replay_failures == 0

        stopped_first = EventListener(source, sink)
        stopped_first.stop()
        await asyncio.wait_for(stopped_first.run(), 0.5)

    asyncio.run(body())


def test_an_error_from_the_sink_ends_the_run_with_it(publisher):
    """In-order batches are delivered by the socket's reader callback, not the listener's task: an exception the
    sink raises there still ends ``run()`` with that exception (not the event loop's exception handler), and the
    batches before it were delivered."""
    pub = publisher()

    class Failing(RecordingSink):
        def on_batch(self, source: EventSource, batch: EventBatch) -> None:
            if batch.seq == failing_seq:
                raise ValueError(f"sink refused seq {batch.seq}")
            super().on_batch(source, batch)

    sink, failing_seq = Failing(), 10**9

    async def body() -> None:
        nonlocal failing_seq
        listener = EventListener(_source(pub), sink)
        task = asyncio.create_task(listener.run())
        await _until(lambda: listener.stats.replays == 1)
        first = await _warm_up(pub, listener, limit=40)
        failing_seq = first + 2
        for i in range(first, first + 5):
            pub.publish(_batch(i))
        with pytest.raises(ValueError, match=f"sink refused seq {failing_seq}"):
            await asyncio.wait_for(task, 5.0)
        assert listener.stats.last_seq == failing_seq - 1

    asyncio.run(body())
    assert sink.seqs_since_reset() == list(range(sink.seqs_since_reset()[-1] + 1))
