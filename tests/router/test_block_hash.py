"""Block hashes must equal SGLang's own page hashes (golden vectors from the project notes)."""

import pytest

from sgl_moe.router.request.block_hash import block_hashes


def test_golden_single_page():
    assert block_hashes([1, 2, 3, 4], 4) == [-3488128144981237669]


def test_golden_chained_pages():
    assert block_hashes([10, 20, 30, 40, 50, 60, 70, 80], 2) == [
        978178666101069530, -895308556211281782, -8033692805846017938, 835415944263129316]


def test_partial_page_is_not_hashed():
    assert block_hashes([1, 2, 3, 4, 5, 6], 4) == block_hashes([1, 2, 3, 4], 4)
    assert block_hashes([1, 2, 3], 4) == []


def test_hash_chains_on_the_parent():
    # Same second page after different first pages must hash differently.
    a = block_hashes([1, 1, 7, 7], 2)
    b = block_hashes([2, 2, 7, 7], 2)
    assert a[1] != b[1]


def test_matches_sglang_implementation():
    utils = pytest.importorskip("sglang.srt.mem_cache.utils")
    tokens = list(range(1000, 1000 + 16 * 5 + 3))
    expected, prior = [], None
    for start in range(0, len(tokens) - 15, 16):
        prior = utils.get_hash_str(tokens[start : start + 16], prior)
        expected.append(utils.hash_str_to_int64(prior))
    assert block_hashes(tokens, 16) == expected


def test_rejects_bad_page_size():
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0)


def test_cache_salt_namespace_matches_sglang_event_hashes():
    utils = pytest.importorskip("sglang.srt.mem_cache.utils")
    from types import SimpleNamespace

    from sgl_moe.router.request.block_hash import salt_seed

    tokens = list(range(7, 7 + 16 * 3))

    class Key(list):
        extra_key = None
        cache_salt = "tenant-a"

    node = SimpleNamespace(key=Key(tokens), parent=None, event_hash_value=None)
    expected = [utils.hash_str_to_int64(h) for h in utils.compute_node_event_hash_values(node, 16)]
    assert block_hashes(tokens, 16, seed=salt_seed("tenant-a")) == expected
    assert expected != block_hashes(tokens, 16)
