"""Decoding of SGLang's KV-cache events (ZMQ PUB, 3 frames: topic, sequence, msgpack payload).

Payload: ``[ts, [event, ...], attn_dp_rank]``. Events are tagged msgpack maps
(``{"type": "BlockStored", ...}``); older SGLang versions sent positional arrays
(``["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]``). Both decode here.
Unknown event types are kept as ``UnknownEvent`` so a newer worker never crashes the router.

The tagged maps decode straight into the typed events below, and a field the router does not declare is
skipped by the decoder without being built: above all ``token_ids`` (a store of 2,000 tokens carries 2,000
ints the router never reads; building them was most of an event's cost). A payload the typed decoder
refuses (the positional format, an unknown event type, a field of the wrong type) is decoded generically.

Before either, the C extension ``native_kv_payload`` reads the common form in one pass (skipping a store's token ids
by their type bytes, where msgspec took ~7.5 ns an id); it answers None for anything else, and msgspec decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from sgl_moe.router.placement.block_tables import PackedHashes


class BlockStored(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    block_hashes: list[int]
    """(From the C reader: ``PackedHashes``, equal to the list; the list is what msgspec decodes and checks.)"""
    block_size: int
    parent_block_hash: int | None = None
    lora_id: int | None = None
    medium: str | None = None
    cache_salt: str | None = None
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    block_hashes: list[int]
    """(As ``BlockStored``'s.)"""
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, frozen=True, tag=True, gc=False):
    pass


@dataclass(frozen=True)
class UnknownEvent:
    type: str
    raw: Any


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(init=False)
class EventBatch:
    """(Not frozen, though nothing changes one once made: one is made per batch, about one per request, and a frozen
    dataclass's ``__init__`` costs about three times as much.)"""

    seq: int
    """Publisher sequence number; consecutive batches differ by one (a gap means lost batches)."""
    ts: float
    events: list[KVEvent]
    dp_rank: int | None

    def __init__(self, seq: int, ts: float, events: list[KVEvent], dp_rank: int | None) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.seq = seq
        self.ts = ts
        self.events = events
        self.dp_rank = dp_rank


class KVEventDecodeError(ValueError):
    """A message that is not a well-formed KV event batch."""


class _TypedPayload(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    attn_dp_rank: int | None = None


_typed = msgspec.msgpack.Decoder(_TypedPayload)
_decoder = msgspec.msgpack.Decoder()
try:
    from sgl_moe.router.membership.native_kv_payload import decode as _native_decode
    NATIVE = True
except ImportError:  # no C compiler at install
    _native_decode, NATIVE = None, False
_POSITIONAL = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"],
               "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}


def _event(raw: Any) -> KVEvent:
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        kind = raw[0]
        fields = dict(zip(_POSITIONAL.get(kind, []), raw[1:]))
    else:
        return UnknownEvent(type="?", raw=raw)
    if kind == "BlockStored":
        return BlockStored(
            block_hashes=[int(h) for h in fields["block_hashes"]],
            parent_block_hash=None if fields.get("parent_block_hash") is None else int(fields["parent_block_hash"]),
            block_size=int(fields["block_size"]), lora_id=fields.get("lora_id"), medium=fields.get("medium"),
            cache_salt=fields.get("cache_salt"), lora_name=fields.get("lora_name"),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(block_hashes=[int(h) for h in fields["block_hashes"]], medium=fields.get("medium"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return UnknownEvent(type=str(kind), raw=raw)


def _from_native(raw: tuple) -> KVEvent:
    """One event of ``native_kv_payload.decode``'s answer (its packed hashes as ``PackedHashes``)."""
    if raw[0] == 0:
        _, hashes, size, parent, lora_id, medium, salt, lora_name = raw
        return BlockStored(block_hashes=_hashes(hashes), block_size=size, parent_block_hash=parent, lora_id=lora_id,
                           medium=medium, cache_salt=salt, lora_name=lora_name)
    if raw[0] == 1:
        return BlockRemoved(block_hashes=_hashes(raw[1]), medium=raw[2])
    return AllBlocksCleared()


def _hashes(hashes: bytes | list[int]) -> list[int] | PackedHashes:
    return PackedHashes("q", hashes) if type(hashes) is bytes else hashes


def decode_payload(payload: bytes, native: bool = NATIVE) -> tuple[float, list[KVEvent], int | None]:
    """(ts, events, attn_dp_rank) of one payload; ``native`` False: msgspec only (the reference the C reader is
    tested against). Raises ``KVEventDecodeError``."""
    answer = _native_decode(payload) if native else None
    if answer is not None:
        ts, events, dp_rank = answer
        return ts, [_from_native(e) for e in events], dp_rank
    try:
        typed = _typed.decode(payload)
        return typed.ts, typed.events, typed.attn_dp_rank
    except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError is a DecodeError: the positional format,
        # an unknown type, ...; a str that is not UTF-8 raises UnicodeDecodeError (it ended the listener until
        # 2026-11-30: found by tests/router/test_kv_payload.py's damaged payloads)
        try:
            return _decode_generic(payload)
        except (msgspec.DecodeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise KVEventDecodeError(f"malformed KV event payload: {exc}") from None


def _decode_generic(payload: bytes) -> tuple[float, list[KVEvent], int | None]:
    raw = _decoder.decode(payload)
    ts, events = raw[0], raw[1]
    return float(ts), [_event(e) for e in events], raw[2] if len(raw) > 2 else None


def decode_frames(frames: list[bytes]) -> tuple[str, EventBatch]:
    """Decode one ZMQ multipart message into (topic, batch)."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq_bytes, payload = frames
    if len(seq_bytes) != 8:
        raise KVEventDecodeError(f"sequence frame must be 8 bytes, got {len(seq_bytes)}")
    ts, events, dp_rank = decode_payload(payload)
    batch = EventBatch(seq=int.from_bytes(seq_bytes, "big", signed=True), ts=ts, events=events, dp_rank=dp_rank)
    return topic.decode(errors="replace"), batch
