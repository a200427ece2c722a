"""Decoding of SGLang KV-event messages, both encodings."""

import msgspec
import pytest

from sgl_moe.router.membership.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    UnknownEvent,
    decode_frames,
)


def _frames(payload, seq=7, topic=b"kv"):
    return [topic, seq.to_bytes(8, "big"), msgspec.msgpack.encode(payload)]


def test_tagged_map_events():
    payload = [1.5, [
        {"type": "BlockStored", "block_hashes": [1153767641419013205, -7753898058568720333], "parent_block_hash": None,
         "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU"},
        {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ], 0]
    topic, batch = decode_frames(_frames(payload))
    assert topic == "kv" and batch.seq == 7 and batch.dp_rank == 0
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes[1] == -7753898058568720333
    assert stored.parent_block_hash is None and stored.block_size == 16 and len(stored.token_ids) == 32
    assert removed == BlockRemoved(block_hashes=[5], medium="GPU")
    assert cleared == AllBlocksCleared()


def test_legacy_array_events():
    payload = [2.0, [["BlockStored", [11, 12], 10, [1, 2, 3, 4], 2, None, "GPU"], ["BlockRemoved", [11], "GPU"],
                     ["AllBlocksCleared"]]]
    _, batch = decode_frames(_frames(payload))
    assert batch.events[0] == BlockStored([11, 12], 10, [1, 2, 3, 4], 2, None, "GPU")
    assert batch.events[1] == BlockRemoved([11], "GPU")
    assert batch.events[2] == AllBlocksCleared()
    assert batch.dp_rank is None


def test_unknown_event_is_kept_not_fatal():
    _, batch = decode_frames(_frames([0.0, [{"type": "BlockPinned", "x": 1}], 0]))
    assert isinstance(batch.events[0], UnknownEvent) and batch.events[0].type == "BlockPinned"


@pytest.mark.parametrize("frames", [
    [b"kv", b"\x00" * 8],
    [b"kv", b"\x00" * 4, b"\x90"],
    [b"kv", b"\x00" * 8, b"\xc1"],
    [b"kv", b"\x00" * 8, msgspec.msgpack.encode([1.0])],
])
def test_malformed_messages_raise_a_decode_error(frames):
    with pytest.raises(KVEventDecodeError):
        decode_frames(frames)
