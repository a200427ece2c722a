"""The messages router replicas exchange through the broker (``--peers``), each defined once.

Every replica publishes, on one subject per cluster (``peer_link``), a ``Batch`` per turn of its event loop that
had something to say: the blocks its requests promised (``Promised``) and gave up (``Retired``), and its own
in-flight FLOPs per worker with its queue length (``Load``, also sent every heartbeat). A replica that joins, or
that sees a gap in another's sequence numbers, publishes ``Hello``; every replica answers a ``Hello`` with its
whole state (``Snapshot``). Workers are named by URL (each replica numbers its workers itself). Encoded as
msgpack; ``VERSION`` is in every message and a replica ignores (and counts) messages of another version.
"""

from __future__ import annotations

import msgspec

from sgl_moe.router.placement.messages import Cancel, Delegate, Place, Placed, Refused, Release, packed_as_bytes

VERSION = 2


class Promised(msgspec.Struct, tag=True, frozen=True):
    serial: int
    """The publishing replica's number for this promise (``Retired`` names it)."""
    worker: str
    """The worker's URL."""
    dp_rank: int
    keys: list[int]
    """The promised block hashes."""


class Retired(msgspec.Struct, tag=True, frozen=True):
    serial: int


class Load(msgspec.Struct, tag=True, frozen=True):
    flops: dict[str, float]
    """Worker URL -> the publishing replica's own in-flight FLOPs there (what it admitted, not what it heard)."""
    queued: int
    """Requests waiting in its queue."""


Update = Promised | Retired | Load


class Batch(msgspec.Struct, tag=True, frozen=True):
    version: int
    replica: str
    seq: int
    """Consecutive per replica across ``Batch`` and ``Snapshot`` messages: a gap means lost messages."""
    updates: list[Update]


class Hello(msgspec.Struct, tag=True, frozen=True):
    version: int
    replica: str
    """Asks every other replica for its ``Snapshot``."""
    joined: bool = False
    """Sent on (re)connecting, not for a gap: whatever the owner placed for this replica before is stale."""


class Snapshot(msgspec.Struct, tag=True, frozen=True):
    version: int
    replica: str
    seq: int
    promised: list[Promised]
    """Every promise of the replica still open."""
    load: Load
    since: float
    """When the replica started (its clock's Unix time): the replica up longest owns placement."""


class Bye(msgspec.Struct, tag=True, frozen=True):
    version: int
    replica: str
    """The replica stops: drop its state at once rather than after ``--peer-timeout-s``."""


class Requests(msgspec.Struct, tag=True, frozen=True):
    version: int
    replica: str
    """The sender; the owner answers on that replica's subject."""
    items: list[Place | Release | Cancel]


class Answers(msgspec.Struct, tag=True, frozen=True):
    version: int
    replica: str
    """The owner that answers."""
    items: list[Placed | Refused | Delegate]


Message = Batch | Hello | Snapshot | Bye | Requests | Answers

_encoder = msgspec.msgpack.Encoder(enc_hook=packed_as_bytes)  # (a ``Place``'s packed keys)
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> Message:
    """Raises ``msgspec.DecodeError`` (a ``ValueError``) for anything that is not one of the messages."""
    return _decoder.decode(data)
