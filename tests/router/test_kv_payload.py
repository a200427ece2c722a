"""The C reader of KV-event payloads (``native_kv_payload``) against the msgspec decoders it stands in front of.

For every payload, ``decode_payload`` with the C reader gives what msgspec alone gives: the same events, or the same
``KVEventDecodeError``. The payloads: SGLang's own batches with every optional field, random maps with extra fields
of every msgpack type and fields of the wrong type, and damaged copies (cut short, bytes changed).
"""

import random
import struct

import msgspec
import pytest

from sgl_moe.router.membership.kv_events import BlockStored, KVEventDecodeError, decode_payload
from sgl_moe.router.placement.block_tables import PackedHashes

native_kv_payload = pytest.importorskip("sgl_moe.router.membership.native_kv_payload",
                                        reason="native_kv_payload not built (no C compiler)")


def _outcome(payload: bytes, native: bool):
    try:
        return decode_payload(payload, native=native)
    except KVEventDecodeError:
        return KVEventDecodeError


def _same(payload: bytes):
    assert _outcome(payload, True) == _outcome(payload, False), payload.hex()


def _sglang_batch(rng: random.Random, tokens: int):
    from sglang.srt.disaggregation import kv_events as sgl

    def maybe(value):
        return value if rng.random() < 0.5 else None

    events = []
    for _ in range(rng.randrange(4)):
        hashes = [rng.randrange(-2 ** 63, 2 ** 63) for _ in range(rng.randrange(8))]
        kind = rng.randrange(3)
        if kind == 0:
            events.append(sgl.BlockStored(
                block_hashes=hashes, parent_block_hash=maybe(rng.randrange(-2 ** 63, 2 ** 63)),
                token_ids=[rng.randrange(200_000) for _ in range(tokens)], block_size=rng.choice([1, 16, 64]),
                lora_id=maybe(rng.randrange(2 ** 40)), medium=maybe("GPU"), cache_salt=maybe("salt é"),
                session_id=maybe("s"), lora_name=maybe("adapter")))
        elif kind == 1:
            events.append(sgl.BlockRemoved(block_hashes=hashes, medium=maybe("CPU_PINNED")))
        else:
            events.append(sgl.AllBlocksCleared())
    return sgl.KVEventBatch(ts=rng.random() * 1e9, events=events, attn_dp_rank=maybe(rng.randrange(8)))


def test_sglangs_own_batches_are_read_in_c_with_msgspecs_answer():
    rng = random.Random(5)
    for _ in range(300):
        payload = msgspec.msgpack.encode(_sglang_batch(rng, tokens=rng.choice([0, 3, 40])))
        assert native_kv_payload.decode(payload) is not None  # the common form: read in C, not handed back
        assert decode_payload(payload, native=True) == decode_payload(payload, native=False)


def test_a_4000_token_store_decodes_to_its_hashes_only():
    hashes = list(range(-125, 125))
    payload = msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": hashes,
                                             "token_ids": list(range(100_000, 104_000)), "block_size": 16}]])
    ts, events, rank = decode_payload(payload)
    assert type(events[0].block_hashes) is PackedHashes  # packed: no int object per hash
    assert (ts, events, rank) == (1.0, [BlockStored(block_hashes=hashes, block_size=16)], None)


def test_hashes_are_packed_where_every_one_fits_in_64_signed_bits_and_a_list_where_one_does_not():
    """Every msgpack int width, signed and unsigned, at its edges, packed; an unsigned hash past 2^63 - 1 (which
    the C block tables refuse, moving the router to the Python ones) keeps the event's hashes a list of ints."""
    fits = [0, 1, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, -1, -32, -33, -128, -129,
            -32768, -32769, -2 ** 31, -2 ** 31 - 1, -2 ** 63]
    for hashes in (fits, fits + [2 ** 63], [2 ** 64 - 1]):
        payload = msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": hashes}]])
        [event] = decode_payload(payload)[1]
        assert event.block_hashes == hashes and list(event.block_hashes) == hashes
        assert (type(event.block_hashes) is PackedHashes) == all(h < 2 ** 63 for h in hashes), hashes


_Ext = msgspec.msgpack.Ext
_ODD_VALUES = [None, True, False, 0, -1, -33, 127, 128, 255, 256, 65535, 65536, -129, -32769, 2 ** 31, -2 ** 31 - 1,
               2 ** 63 - 1, -2 ** 63, 2 ** 64 - 1, 1.5, "", "x" * 31, "y" * 32, "z" * 300, "w" * 70_000, b"",
               b"b" * 300, b"c" * 70_000, _Ext(1, b"a"), _Ext(2, b"ab"), _Ext(3, b"abcd"), _Ext(4, b"x" * 8),
               _Ext(5, b"x" * 16), _Ext(6, b"x" * 3), _Ext(7, b"x" * 300), _Ext(8, b"x" * 70_000), [],
               [1, [2, {"a": [3]}]], {}, {"k": {"n": [None, 1.0]}}, list(range(20)), {str(i): i for i in range(20)}]


def _random_event(rng: random.Random):
    kind = rng.choice(["BlockStored", "BlockRemoved", "AllBlocksCleared", "BlockPinned"])
    fields = {"block_hashes": [rng.randrange(-2 ** 63, 2 ** 64) for _ in range(rng.randrange(5))],
              "block_size": rng.randrange(1, 100), "parent_block_hash": rng.choice([None, rng.randrange(-5, 5)]),
              "lora_id": rng.choice([None, 3]), "medium": rng.choice([None, "GPU"]), "cache_salt": "s",
              "lora_name": None, "token_ids": [rng.randrange(300_000) for _ in range(rng.randrange(50))]}
    for name in list(fields):
        roll = rng.random()
        if roll < 0.15:
            del fields[name]
        elif roll < 0.25:
            fields[name] = rng.choice(_ODD_VALUES)  # wrong type, or right type of an odd size
    for _ in range(rng.randrange(3)):
        fields[rng.choice(["extra", "session_id", "x" * 40])] = rng.choice(_ODD_VALUES)
    items = list(fields.items())
    rng.shuffle(items)
    at = 0 if rng.random() < 0.9 else rng.randrange(len(items) + 1)  # the tag first, as msgspec writes it
    items.insert(at, ("type", kind))
    return dict(items)


def test_random_and_odd_payloads_give_msgspecs_answer():
    rng = random.Random(11)
    for _ in range(1500):
        batch = [rng.choice([rng.random(), 7, None, "t"]) if rng.random() < 0.05 else rng.random(),
                 [_random_event(rng) for _ in range(rng.randrange(4))]]
        if rng.random() < 0.6:
            batch.append(rng.choice([0, 5, None, -1, 2 ** 64 - 1, "r"]))
        if rng.random() < 0.03:
            batch.append(1)  # one element too many
        _same(msgspec.msgpack.encode(batch))


def test_a_float32_timestamp_and_long_headers_are_read():
    stored = msgspec.msgpack.encode({"type": "BlockStored", "block_hashes": [1], "block_size": 2})
    for head in (b"\x93\xca" + struct.pack(">f", 1.5), b"\xdc\x00\x03\xcb" + struct.pack(">d", 2.5),
                 b"\xdd\x00\x00\x00\x03\xcb" + struct.pack(">d", 2.5)):
        for events in (b"\x91", b"\xdc\x00\x01", b"\xdd\x00\x00\x00\x01"):
            payload = head + events + stored + b"\x01"
            assert _outcome(payload, True) != KVEventDecodeError
            _same(payload)


def test_damaged_payloads_give_msgspecs_answer():
    rng = random.Random(3)
    for _ in range(200):
        payload = msgspec.msgpack.encode(_sglang_batch(rng, tokens=5))
        for cut in range(len(payload)):
            _same(payload[:cut])
        _same(payload + b"\x00")
        for _ in range(20):
            damaged = bytearray(payload)
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            _same(bytes(damaged))


def test_a_claimed_length_past_the_payload_is_refused_without_allocating_it():
    for payload in (b"\x92\xcb" + struct.pack(">d", 1.0) + b"\xdd\xff\xff\xff\xff",
                    b"\x92\xcb" + struct.pack(">d", 1.0) + b"\x91\x82\xa4type\xabBlockStored\xacblock_hashes"
                    b"\xdd\xff\xff\xff\xff"):
        assert native_kv_payload.decode(payload) is None
        _same(payload)
