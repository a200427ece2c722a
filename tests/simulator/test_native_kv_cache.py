"""The simulator's KV cache model in C (``native_kv_cache.KVPages``) against its Python reference
(``kv_cache.KVCacheModel``), answer for answer, over random operation sequences shaped like the engine's: chains of
pages that share prefixes, locked while their requests run, unlocked deepest first, evicted oldest first."""

from __future__ import annotations

import random
import shutil

import pytest

from sgl_moe.simulator import kv_cache
from sgl_moe.simulator.kv_cache import KVCacheModel

HAVE_CC = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))
needs_native = pytest.mark.skipif(not kv_cache.NATIVE, reason="native_kv_cache was not built (no C compiler)")


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler on PATH: the Python model runs, as it should")
def test_the_extension_was_built_where_a_compiler_is():
    assert kv_cache.NATIVE, ("a C compiler is on PATH but the install did not build native_kv_cache; rebuild with "
                             "`bash tools/bootstrap.sh` (pip install -e . builds it) and read its build output")
    assert type(kv_cache.new_kv_cache(4)).__name__ == "KVPages"


def _state(c) -> tuple:
    return len(c), c.free, c.reserved, c.evicted, list(c.stored), list(c.removed)


def _both(capacity: int):
    return KVCacheModel(capacity), kv_cache.native_kv_cache.KVPages(capacity)


@needs_native
@pytest.mark.parametrize("seed", range(12))
def test_random_engine_like_sequences_give_the_same_answers_and_events(seed):
    rng = random.Random(seed)
    capacity = rng.choice([1, 3, 8, 40, 300])
    ref, nat = _both(capacity)
    # Chains that share prefixes: a few roots, each extended; hashes spread over the signed 64-bit range.
    chains: list[list[int]] = []
    for _ in range(rng.randrange(3, 30)):
        base = rng.choice(chains)[: rng.randrange(0, 6)] if chains and rng.random() < 0.6 else []
        chains.append(base + [rng.randrange(-2**63, 2**63) for _ in range(rng.randrange(1, 12))])
    running: list[tuple[list[int], int]] = []  # (hashes, pages locked) of requests holding pages
    evictions = 0
    for step in range(3000):
        op = rng.random()
        if op < 0.35:  # a request starts: lock its cached prefix, reserve the rest
            hashes = rng.choice(chains)
            limit = rng.randrange(0, len(hashes) + 2)
            got = nat.match_lock(hashes, limit)
            assert got == ref.match_lock(hashes, limit)
            pages = rng.randrange(0, 6)
            ok = nat.reserve(pages)
            assert ok == ref.reserve(pages)
            if ok:
                running.append((hashes, got))
            else:
                nat.unlock(hashes[:got])
                ref.unlock(hashes[:got])
        elif op < 0.65 and running:  # a request ends: its pages enter the tree, all unlocked
            hashes, locked = running.pop(rng.randrange(len(running)))
            full = rng.randrange(locked, len(hashes) + 1)
            nat.finish(hashes, locked, full)
            ref.finish(hashes, locked, full)
            back = min(ref.reserved, rng.randrange(0, 6))
            nat.reserved -= back
            ref.reserved -= back
            # ``finish`` unlocked hashes[:full]; the pages it inserted beyond ``locked`` were locked by it first
        elif op < 0.75 and running:  # a chunk of a running request enters the tree
            i = rng.randrange(len(running))
            hashes, locked = running[i]
            if locked < len(hashes):
                upto = rng.randrange(locked + 1, len(hashes) + 1)
                assert nat.insert(hashes[locked:upto]) == ref.insert(hashes[locked:upto])
                running[i] = (hashes, upto)
        elif op < 0.85:
            hashes = rng.choice(chains)
            assert nat.match(hashes) == ref.match(hashes)
        elif op < 0.92:
            assert nat.take_events() == ref.take_events()
        else:
            pages = rng.randrange(0, capacity + 3)
            assert nat.reserve(pages) == ref.reserve(pages)
        assert _state(nat) == _state(ref), step
        evictions = max(evictions, nat.evicted)
    for hashes, locked in running:
        nat.unlock(hashes[:locked])
        ref.unlock(hashes[:locked])
    # Every page unlocked: evicting everything shows the whole LRU order.
    ref.reserved = nat.reserved = 0
    assert nat.reserve(capacity) == ref.reserve(capacity)
    assert _state(nat) == _state(ref)
    assert evictions > 0  # the sequence reached the eviction path, not only the lookups
    assert len(nat) == 0  # every page was unlocked, so every page was evictable


@needs_native
def test_misuse_raises_as_the_reference_does():
    ref, nat = _both(4)
    for c in (ref, nat):
        with pytest.raises(KeyError):
            c.unlock([5])
        with pytest.raises(KeyError):
            c.lock([5])
    with pytest.raises(ValueError, match="at least one page"):
        kv_cache.native_kv_cache.KVPages(0)
    with pytest.raises(OverflowError):
        nat.insert([2**63])


@needs_native
def test_the_table_grows_and_shrinks_through_many_pages():
    ref, nat = _both(50_000)
    rng = random.Random(7)
    keys = [rng.randrange(-2**63, 2**63) for _ in range(40_000)]
    assert nat.reserve(40_000) == ref.reserve(40_000)
    assert nat.insert(keys) == ref.insert(keys) == 40_000
    nat.reserved = ref.reserved = 0  # (the reserved pages became tree pages)
    nat.unlock(keys)
    ref.unlock(keys)
    assert nat.reserve(45_000) == ref.reserve(45_000)  # evicts 35,000 of them, oldest first
    assert _state(nat) == _state(ref)
    assert nat.match(keys[:5000]) == ref.match(keys[:5000]) == 5000
    assert [nat.match([k]) for k in keys[5000:5100]] == [ref.match([k]) for k in keys[5000:5100]] == [0] * 100
    assert nat.evicted == ref.evicted == 35_000 and len(nat) == 5000
