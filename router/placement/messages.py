"""The messages between a router's front processes and its placement owner (``--front-processes N``), each
defined once, and their framing on the owner's Unix socket.

A front sends ``Place`` for a request it has parsed, tokenized and hashed, and ``Release`` (or ``Cancel``, when
its client left before the answer) for each ``Place``; the owner answers every ``Place`` with ``Placed``,
``Refused`` or ``Delegate`` (the owner runs that request itself: a suspect, ``suspects``). The owner sends
``Model`` whenever what fronts need to parse requests changes (the first worker joined, the last one left, the
tokenizer was found inexact). Frames: a 4-byte big-endian length, then a msgpack-encoded tagged struct.
``Hello`` opens a connection and carries ``VERSION``; the owner refuses any other version.
"""

from __future__ import annotations

import array
import asyncio
import struct
import sys
from typing import Any

import msgspec

from sgl_moe.router.request.block_hash import PackedHashes

VERSION = 2
MAX_FRAME = 256 * 2**20
"""A frame larger than this is a broken peer (a request's keys are at most --max-request-tokens hashes)."""


class Hello(msgspec.Struct, tag=True, frozen=True):
    version: int
    front: int
    """The front's index (0-based), for logs."""


class Place(msgspec.Struct, tag=True, frozen=True):
    req: int
    """The front's number for this request (unique per connection); ``Placed``/``Release`` name it."""
    rid: str
    prompt_lens: list[int]
    keys: list[list[int] | bytes]
    """``Job.keys``: block hashes per prompt, ``[]`` for no affinity. Packed hashes (``PackedHashes``) travel as the
    bytes of their int64s, little-endian (a replica's owner may be another host); ``place_keys`` packs them again."""
    shared_prefix_len: int
    max_new_tokens: int
    fingerprint: bytes
    """``SuspectList.fingerprint``: a request the owner holds for a suspect is delegated to it."""


def place_keys(msg: Place) -> list[list[int] | PackedHashes]:
    """``msg.keys`` as ``Job.keys``: packed hashes packed again. ValueError for bytes that are not whole int64s (a
    broken peer: msgspec's decoding checks only that they are bytes)."""
    return [_unpack(k) if type(k) is bytes else k for k in msg.keys]


def _unpack(raw: bytes) -> PackedHashes:
    if len(raw) % 8:
        raise ValueError(f"packed block hashes of {len(raw)} bytes, not a whole number of int64s")
    hashes = PackedHashes("q", raw)
    if sys.byteorder != "little":
        hashes.byteswap()
    return hashes


class Release(msgspec.Struct, tag=True, frozen=True):
    req: int
    ok: bool
    """The worker answered (its promised blocks count as stored)."""
    reported_cached_tokens: int = -1
    """What the worker said it had cached (``meta_info.cached_tokens``), -1 when it did not say."""
    failed: bool = False
    """The worker failed the request (the front then delegates it to the owner, which retries it)."""


class Cancel(msgspec.Struct, tag=True, frozen=True):
    req: int
    """The client left before ``Placed`` reached the front: dequeue the request, or release its placement."""


class Placed(msgspec.Struct, tag=True, frozen=True):
    req: int
    worker_id: str
    worker_url: str
    predicted_cached_tokens: int
    queued_s: float
    decision_s: float
    reason: str


class Refused(msgspec.Struct, tag=True, frozen=True):
    req: int
    status: int
    message: str
    kind: str
    retry_after: str | None = None


class Delegate(msgspec.Struct, tag=True, frozen=True):
    req: int


class Model(msgspec.Struct, tag=True, frozen=True):
    """What a front needs to parse: None fields while no worker is registered."""

    worker_url: str | None = None
    """Where the front fetches the tokenizer from (``Discovery.fetch_tokenizer``)."""
    worker_info: dict[str, Any] | None = None
    """That worker's ``WorkerInfo`` (``wire.to_builtins``)."""
    model_name: str | None = None
    context_length: int = 0
    page_size: int = 0
    limits: dict[str, Any] | None = None
    """``RequestLimits`` fields."""
    plain: bool = False
    """The worker is a plain SGLang server: the tokenizer comes from the router's own flags (``plain_worker``)."""
    inexact_reason: str | None = None
    """Set when a worker's ids disagreed with the router's tokenizer (``RouterTokenizer.mark_inexact``)."""
    memo: bool = True
    """False with ``--no-prefix-memo``."""


ToOwner = Hello | Place | Release | Cancel
ToFront = Placed | Refused | Delegate | Model

def packed_as_bytes(obj: Any) -> Any:
    """msgspec's hook for types it does not encode: packed hashes (an ``array`` of ``q``) as their bytes,
    little-endian."""
    if isinstance(obj, array.array) and obj.typecode == "q":
        if sys.byteorder != "little":
            obj = array.array("q", obj)
            obj.byteswap()
        return obj.tobytes()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_encoder = msgspec.msgpack.Encoder(enc_hook=packed_as_bytes)
_to_owner = msgspec.msgpack.Decoder(ToOwner)
_to_front = msgspec.msgpack.Decoder(ToFront)
_LEN = struct.Struct(">I")


class Outbox:
    """Frames for one connection, written together once per turn of the event loop: under load one send
    carries many messages (each message its own send cost the owner ~0.3 ms of CPU per request, measured)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._parts: list[bytes] = []

    def put(self, message: ToOwner | ToFront) -> None:
        if not self._parts:
            asyncio.get_running_loop().call_soon(self.flush)
        self._parts.append(frame(message))

    def flush(self) -> None:
        if self._parts and not self.writer.is_closing():
            self.writer.write(b"".join(self._parts))
        self._parts.clear()


def frame(message: ToOwner | ToFront) -> bytes:
    body = _encoder.encode(message)
    return _LEN.pack(len(body)) + body


async def _read(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME}-byte limit")
    return await reader.readexactly(n)


async def read_to_owner(reader: asyncio.StreamReader) -> ToOwner:
    """The next message from a front; ``asyncio.IncompleteReadError`` at the end of the stream."""
    return _to_owner.decode(await _read(reader))


async def read_to_front(reader: asyncio.StreamReader) -> ToFront:
    return _to_front.decode(await _read(reader))
