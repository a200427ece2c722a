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
    assert stored.parent_block_hash is None and stored.block_size == 16
    assert not hasattr(stored, "token_ids")  # skipped by the decoder, never built
    assert removed == BlockRemoved(block_hashes=[5], medium="GPU")
    assert cleared == AllBlocksCleared()


def test_legacy_array_events():
    payload = [2.0, [["BlockStored", [11, 12], 10, [1, 2, 3, 4], 2, None, "GPU"], ["BlockRemoved", [11], "GPU"],
                     ["AllBlocksCleared"]]]
    _, batch = decode_frames(_frames(payload))
    assert batch.events[0] == BlockStored(block_hashes=[11, 12], parent_block_hash=10, block_size=2, medium="GPU")
    assert batch.events[1] == BlockRemoved(block_hashes=[11], medium="GPU")
    assert batch.events[2] == AllBlocksCleared()
    assert batch.dp_rank is None


def test_unknown_event_is_kept_not_fatal():
    _, batch = decode_frames(_frames([0.0, [{"type": "BlockPinned", "x": 1}], 0]))
    assert isinstance(batch.events[0], UnknownEvent) and batch.events[0].type == "BlockPinned"


def test_an_unknown_event_beside_known_ones_keeps_them_all():
    """The typed decoder refuses the whole batch; the generic one keeps every event, in order."""
    stored = {"type": "BlockStored", "block_hashes": [3, 4], "parent_block_hash": 2, "token_ids": [9] * 8,
              "block_size": 4, "lora_id": None}
    _, batch = decode_frames(_frames([0.5, [stored, {"type": "BlockPinned"}, {"type": "BlockRemoved",
                                                                             "block_hashes": [3]}], 1]))
    assert batch.events[0] == BlockStored(block_hashes=[3, 4], parent_block_hash=2, block_size=4)
    assert isinstance(batch.events[1], UnknownEvent)
    assert batch.events[2] == BlockRemoved(block_hashes=[3]) and batch.dp_rank == 1 and batch.ts == 0.5


def test_sglangs_own_batches_take_the_typed_path():
    """What SGLang 0.5.23's publisher encodes decodes without the generic fallback (the fallback builds every
    token id), with every field the router reads."""
    from sglang.srt.disaggregation import kv_events as sgl

    from sgl_moe.router.membership import kv_events

    batch = sgl.KVEventBatch(ts=3.0, events=[
        sgl.BlockRemoved(block_hashes=[-1, 2 ** 63 - 1], medium="GPU"),
        sgl.BlockStored(block_hashes=[5, 6], parent_block_hash=-9, token_ids=list(range(32)), block_size=16,
                        lora_id=None, medium="GPU", cache_salt="s", session_id="x"),
        sgl.AllBlocksCleared()], attn_dp_rank=2)
    payload = msgspec.msgpack.encode(batch)
    typed = kv_events._typed.decode(payload)  # raises if SGLang's shape left the typed decoder
    _, decoded = decode_frames([b"kv", (11).to_bytes(8, "big"), payload])
    assert decoded.events == typed.events == [
        BlockRemoved(block_hashes=[-1, 2 ** 63 - 1], medium="GPU"),
        BlockStored(block_hashes=[5, 6], parent_block_hash=-9, block_size=16, medium="GPU", cache_salt="s"),
        AllBlocksCleared()]
    assert decoded.dp_rank == 2 and decoded.ts == 3.0 and decoded.seq == 11


@pytest.mark.parametrize("frames", [
    [b"kv", b"\x00" * 8],
    [b"kv", b"\x00" * 4, b"\x90"],
    [b"kv", b"\x00" * 8, b"\xc1"],
    [b"kv", b"\x00" * 8, msgspec.msgpack.encode([1.0])],
    [b"kv", b"\x00" * 8, msgspec.msgpack.encode([1.0, []])[:-1] + b"\x91\x81\xa4type\xa2\xff\xfe"],  # not UTF-8
])
def test_malformed_messages_raise_a_decode_error(frames):
    with pytest.raises(KVEventDecodeError):
        decode_frames(frames)
