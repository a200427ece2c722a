"""Decoding of SGLang's KV-cache events (ZMQ PUB, 3 frames: topic, sequence, msgpack payload).

Payload: ``[ts, [event, ...], attn_dp_rank]``. Events are tagged msgpack maps
(``{"type": "BlockStored", ...}``); older SGLang versions sent positional arrays
(``["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]``). Both decode here.
Unknown event types are kept as ``UnknownEvent`` so a newer worker never crashes the router.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from sgl_moe.router.request.block_hash import BlockHash


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    cache_salt: str | None = None
    lora_name: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


@dataclass(frozen=True)
class UnknownEvent:
    type: str
    raw: Any


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True)
class EventBatch:
    seq: int
    """Publisher sequence number; consecutive batches differ by one (a gap means lost batches)."""
    ts: float
    events: list[KVEvent]
    dp_rank: int | None


class KVEventDecodeError(ValueError):
    """A message that is not a well-formed KV event batch."""


_decoder = msgspec.msgpack.Decoder()


def _event(raw: Any) -> KVEvent:
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        kind = raw[0]
        names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                 "medium"],
                 "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}.get(kind, [])
        fields = dict(zip(names, raw[1:]))
    else:
        return UnknownEvent(type="?", raw=raw)
    if kind == "BlockStored":
        return BlockStored(
            block_hashes=list(fields["block_hashes"]),
            parent_block_hash=None if fields.get("parent_block_hash") is None
            else BlockHash(fields["parent_block_hash"]),
            token_ids=list(fields.get("token_ids") or []), block_size=int(fields["block_size"]),
            lora_id=fields.get("lora_id"), medium=fields.get("medium"), cache_salt=fields.get("cache_salt"),
            lora_name=fields.get("lora_name"),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(block_hashes=list(fields["block_hashes"]), medium=fields.get("medium"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return UnknownEvent(type=str(kind), raw=raw)


def decode_frames(frames: list[bytes]) -> tuple[str, EventBatch]:
    """Decode one ZMQ multipart message into (topic, batch)."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq_bytes, payload = frames
    if len(seq_bytes) != 8:
        raise KVEventDecodeError(f"sequence frame must be 8 bytes, got {len(seq_bytes)}")
    try:
        raw = _decoder.decode(payload)
        ts, events = raw[0], raw[1]
        dp_rank = raw[2] if len(raw) > 2 else None
        batch = EventBatch(seq=int.from_bytes(seq_bytes, "big", signed=True), ts=float(ts),
                           events=[_event(e) for e in events], dp_rank=dp_rank)
    except (msgspec.DecodeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise KVEventDecodeError(f"malformed KV event payload: {exc}") from None
    return topic.decode(errors="replace"), batch
