"""``token_ids``: packed ids equal to their list, and their JSON text (C, against the reference and orjson)."""

from __future__ import annotations

import array
import random

import orjson
import pytest

from sgl_moe.router.request import token_ids
from sgl_moe.router.request.token_ids import TokenIds, as_list, json_text_py

needs_native = pytest.mark.skipif(not token_ids.NATIVE, reason="native_token_ids was not built (no C compiler)")

EDGES = [0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 9999, 10_000, 99_999, 100_000, 999_999, 1_000_000, 9_999_999,
         10_000_000, 99_999_999, 100_000_000, 999_999_999, 1_000_000_000, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
"""Every decimal length's first and last value, and uint32's ends."""


def test_token_ids_equal_the_list_of_their_ints_both_ways():
    ids = TokenIds("I", [5, 0, 2**32 - 1])
    assert ids == [5, 0, 2**32 - 1] and [5, 0, 2**32 - 1] == ids and not ids != [5, 0, 2**32 - 1]
    assert ids != [5, 0] and [5, 0, 1] != ids and ids != (5, 0, 2**32 - 1)
    assert ids == TokenIds("I", [5, 0, 2**32 - 1]) and ids == array.array("I", [5, 0, 2**32 - 1])
    copy = ids.copy()
    assert type(copy) is TokenIds and copy == ids and copy is not ids
    copy[0] = 6
    assert ids[0] == 5
    with pytest.raises(TypeError):
        hash(ids)
    assert repr(ids) == "TokenIds([5, 0, 4294967295])"
    assert as_list(ids) == [5, 0, 2**32 - 1] and type(as_list(ids)) is list
    with pytest.raises(TypeError):
        as_list({1})
    assert orjson.dumps({"a": [ids, 1]}, default=as_list) == b'{"a":[[5,0,4294967295],1]}'


@needs_native
def test_json_text_writes_what_orjson_writes_for_the_list():
    rng = random.Random(3)
    def some() -> int:
        return rng.choice([rng.choice(EDGES), rng.randrange(2**32), rng.randrange(200_000)])

    cases = [[], [0], EDGES, EDGES[::-1]] + [[some() for _ in range(rng.randrange(60))] for _ in range(500)]
    for ids in cases:
        packed = TokenIds("I", ids)
        assert token_ids.json_text(packed) == json_text_py(packed) == orjson.dumps(ids)
        n = len(ids)
        for start, end in [(0, None), (1, None), (n // 2, n), (-3, None), (2, -1), (n + 5, None), (3, 2), (-99, 99),
                           (rng.randrange(n + 1), rng.randrange(n + 1)) if n else (0, 0)]:
            want = orjson.dumps(ids[start:end])
            assert token_ids.json_text(packed, start, end) == json_text_py(packed, start, end) == want, (start, end)
        assert token_ids.json_text(memoryview(packed)) == orjson.dumps(ids)
        assert token_ids.json_text(array.array("I", ids)[1:]) == orjson.dumps(ids[1:])


@needs_native
@pytest.mark.parametrize("not_ids", [b"1234", array.array("i", [1, 2]), array.array("Q", [1]), array.array("H", [1]),
                                     [1, 2]])
def test_json_text_refuses_what_is_not_uint32(not_ids):
    with pytest.raises(TypeError):
        token_ids.json_text(not_ids)
