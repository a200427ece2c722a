"""KV-event messages read in C (``native_zmq_read``) equal what pyzmq reads (``event_listener._ready_messages``).

Real ZMQ sockets (PUB/SUB over TCP on loopback, as SGLang's publisher and the router's listener use them): the same
multipart messages (empty frames, one-byte frames, frames of a megabyte, many frames) sent to two subscribers, one
read each way; the reads agree message for message, frame for frame, in order, also when more messages are waiting
than one read takes.
"""

from __future__ import annotations

import random
import time

import pytest
import zmq

from sgl_moe.router.membership import event_listener
from sgl_moe.router.membership.event_listener import _CHUNK, _reading, _ready_messages

pytestmark = pytest.mark.skipif(not event_listener.NATIVE, reason="native_zmq_read not built or libzmq not found")


def _messages(rng: random.Random, n: int) -> list[list[bytes]]:
    sizes = [0, 1, 8, 100, 4096, 70_000, 1 << 20]
    return [[rng.randbytes(rng.choice(sizes)) for _ in range(rng.choice([1, 1, 3, 3, 7]))] for _ in range(n)]


def _drain(read, want: int) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    deadline = time.monotonic() + 20
    while len(got) < want and time.monotonic() < deadline:
        batch = read()
        got.extend(batch)
        if not batch:
            time.sleep(0.005)
    return got


def test_native_reads_equal_pyzmq_reads_on_a_real_pub_sub_pair():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    subs = [ctx.socket(zmq.SUB) for _ in range(2)]
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        for s in subs:
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.setsockopt(zmq.RCVHWM, 0)
            s.connect(f"tcp://127.0.0.1:{port}")
        pub.setsockopt(zmq.SNDHWM, 0)
        time.sleep(0.3)  # slow joiner
        sent = _messages(random.Random(3), 3 * _CHUNK + 17)
        for m in sent:
            pub.send_multipart(m)
        native = _reading(zmq.Socket.shadow(subs[0].underlying))
        plain = zmq.Socket.shadow(subs[1].underlying)
        first = native()
        assert len(first) <= _CHUNK
        assert _drain(native, len(sent) - len(first)) == sent[len(first):] and first == sent[:len(first)]
        assert _drain(lambda: _ready_messages(plain), len(sent)) == sent
        assert native() == [] and _ready_messages(plain) == []  # nothing more: an empty read, no error
    finally:
        for s in (pub, *subs):
            s.close(0)
        ctx.term()


def test_a_closed_socket_is_refused_not_read():
    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    read = _reading(zmq.Socket.shadow(s.underlying))
    assert read() == []
    s.close(0)
    ctx.term()
    with pytest.raises(ValueError):
        event_listener.READER.ready(0, 4)
