"""The router's C loops (``native_page_hash``, ``native_word_pieces``, ``native_block_tables``) against their Python
references, value for value.

Each runs where the install had a C compiler; here, where one is on PATH, the tests also require that it was built
(an install that silently fell back to Python would otherwise pass everything and run slower)."""

from __future__ import annotations

import hashlib
import random
import shutil

import pytest

from sgl_moe.router.placement import block_tables
from sgl_moe.router.request import block_hash, word_pieces

try:
    from sgl_moe.router.request import native_page_hash
except ImportError:
    native_page_hash = None

HAVE_CC = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))
needs_native = pytest.mark.skipif(not (block_hash.NATIVE and word_pieces.NATIVE and block_tables.NATIVE),
                                  reason="the C extensions were not built (no C compiler at install)")


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler on PATH: the Python references run, as they should")
def test_the_extensions_were_built_where_a_compiler_is():
    assert block_hash.NATIVE and word_pieces.NATIVE and block_tables.NATIVE, (
        "a C compiler is on PATH but the install did not build the router's C extensions; rebuild with "
        "`bash tools/bootstrap.sh` (pip install -e . builds them) and read its build output")


# -- page hashes ----------------------------------------------------------------------------------------------------
def _backends():
    if native_page_hash is None:
        return []
    names = ["portable"]
    try:
        native_page_hash.set_backend("openssl")
        names.append("openssl")
    except RuntimeError:
        pass
    return names


@needs_native
@pytest.mark.parametrize("backend", ["portable", "openssl"])
def test_page_hash_chain_equals_the_python_reference(backend):
    if backend not in _backends():
        pytest.skip("no libcrypto to open")
    before = native_page_hash.backend()
    native_page_hash.set_backend(backend)
    try:
        rng = random.Random(backend)
        seeds = [None, b"", block_hash.salt_seed("tenant-7"), b"x" * 7, b"y" * 64]
        for _ in range(400):
            page = rng.choice([1, 2, 3, 16, 32, 64, 100])
            ids = [rng.choice([0, 1, 2**31, 2**32 - 1, rng.randrange(2**32)]) for _ in range(rng.randrange(0, 700))]
            seed = rng.choice(seeds)
            got = native_page_hash.block_hash_chain(ids, page, seed)
            want = block_hash.block_hash_chain_py(ids, page, seed)
            assert got == want, (page, len(ids), seed)
            if len(ids) < page:
                assert got[1] is seed  # nothing hashed: the seed as given, None stays None
    finally:
        native_page_hash.set_backend(before)


@needs_native
@pytest.mark.parametrize("backend", ["portable", "openssl"])
def test_page_hash_chain_over_bytes_equals_the_chain_over_ids(backend):
    """``block_hash_chain_bytes`` (the simulator's stream: ids already as uint32 little-endian bytes) gives the chain
    over ids, full pages only, a trailing partial page left alone, any seed; bytearrays and memoryviews too."""
    if backend not in _backends():
        pytest.skip("no libcrypto to open")
    before = native_page_hash.backend()
    native_page_hash.set_backend(backend)
    try:
        rng = random.Random(f"bytes-{backend}")
        for _ in range(300):
            page = rng.choice([1, 3, 16, 64])
            ids = [rng.randrange(2**32) for _ in range(rng.randrange(0, 400))]
            data = b"".join(i.to_bytes(4, "little") for i in ids) + bytes(rng.randrange(4))  # a ragged tail too
            seed = rng.choice([None, b"", block_hash.salt_seed("t"), b"z" * 32])
            want = block_hash.block_hash_chain_py(ids, page, seed)
            for view in (data, bytearray(data), memoryview(data)):
                got = native_page_hash.block_hash_chain_bytes(view, page, seed)
                assert got == want, (page, len(ids), seed)
        with pytest.raises(ValueError, match="page_size must be positive"):
            native_page_hash.block_hash_chain_bytes(b"1234", 0)
        with pytest.raises(TypeError):
            native_page_hash.block_hash_chain_bytes([1, 2], 1)  # ids, not bytes
    finally:
        native_page_hash.set_backend(before)


@needs_native
def test_portable_sha256_matches_hashlib_on_every_length_around_its_block_edges():
    """The portable SHA-256 through the chain's first page (no seed): lengths 4..260 bytes cross the 55/56/64-byte
    padding edges."""
    before = native_page_hash.backend()
    native_page_hash.set_backend("portable")
    try:
        for n in range(1, 66):
            ids = list(range(1000, 1000 + n))
            [h], digest = native_page_hash.block_hash_chain(ids, n)
            data = b"".join(i.to_bytes(4, "little") for i in ids)
            assert digest == hashlib.sha256(data).digest(), n
            assert h == int.from_bytes(digest[:8], "big", signed=True)
    finally:
        native_page_hash.set_backend(before)


@needs_native
@pytest.mark.parametrize("ids, error", [([1, -1], OverflowError), ([2**32], OverflowError),
                                        ([1, 2, 3, 2**40], OverflowError), ([1, 2.0], TypeError), (["1"], TypeError)])
def test_page_hash_refuses_what_the_reference_refuses(ids, error):
    """Ids outside uint32 anywhere (the trailing partial page included) fail as ``array("I")`` fails them."""
    with pytest.raises(error):
        block_hash.block_hash_chain_py(ids, 2)
    with pytest.raises(error):
        native_page_hash.block_hash_chain(ids, 2)


@needs_native
def test_page_hash_refuses_a_page_size_below_one():
    for page in (0, -3):
        with pytest.raises(ValueError, match="page_size must be positive"):
            native_page_hash.block_hash_chain([1, 2], page)


# -- word pieces ----------------------------------------------------------------------------------------------------
ALPHABET = ["a", "bc", "é", "日本", "👩\u200d💻", "\n", "\t", " ", "  ", "   ", " " * 5, "x" * 70, ".", "1"]


def _texts(rng: random.Random, n: int) -> list[str]:
    fixed = ["", " ", "  ", "   ", "a", " a", "  a", "a ", "a  ", "a  b", "  a  b  ", "a b c", "é ü", "a\u200d b"]
    return fixed + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def _pieces(text: str) -> list[str]:
    import re

    return re.findall(r" *[^ ]+| +", text)


def _tables(rng: random.Random, texts: list[str], share: float) -> tuple[dict, dict]:
    """``PieceCache``'s two tables holding ids for about ``share`` of the texts' pieces."""
    kept, words = {}, {}
    for piece in {p for t in texts for p in _pieces(t)}:
        if rng.random() < share:
            ids = [rng.randrange(50_000) for _ in range(rng.randint(0, 3))]
            if piece[:1] == " " and piece[1:2] != " ":
                words[piece[1:]] = ids
            else:
                kept[piece] = ids
    return kept, words


def _finish(result, ids_of: dict) -> tuple[list[int], list[str], int]:
    found, missing, new, count = result
    if missing is None:
        return found, [], count
    found = list(found)
    for j, piece in zip(missing, new):
        found[j] = ids_of[piece]
    return word_pieces.join_py(found), new, count


@needs_native
@pytest.mark.parametrize("share", [1.0, 0.8, 0.2, 0.0])
def test_word_pieces_lookup_equals_the_python_reference(share):
    """Same ids, same new pieces in the same order, same piece count, for texts with runs of spaces at the start,
    inside and at the end, multi-byte characters, ZWJ sequences and pieces longer than any kept one."""
    rng = random.Random(f"pieces-{share}")
    texts = _texts(rng, 3000)
    kept, words = _tables(rng, texts, share)
    ids_of = {p: [rng.randrange(50_000) for _ in range(rng.randint(1, 3))] for t in texts for p in _pieces(t)}
    for text in texts:
        got = _finish(word_pieces.native_word_pieces.lookup(text, kept, words), ids_of)
        want = _finish(word_pieces.lookup_py(text, kept, words), ids_of)
        assert got == want, repr(text)
        assert got[2] == len(_pieces(text))
        native_found = word_pieces.native_word_pieces.lookup(text, kept, words)
        if native_found[1] is not None:
            filled = list(native_found[0])
            for j, piece in zip(native_found[1], native_found[2]):
                filled[j] = ids_of[piece]
            assert word_pieces.native_word_pieces.join(filled) == got[0]


@needs_native
def test_word_pieces_join_refuses_a_hole():
    with pytest.raises(TypeError):
        word_pieces.native_word_pieces.join([[1], None])
    assert word_pieces.native_word_pieces.join([]) == []


# -- block tables ---------------------------------------------------------------------------------------------------
class _Tables:
    """One target set's tables (``BlockIndex``'s layout) and the loops that change them: the C or the Python ones."""

    def __init__(self, loops: dict) -> None:
        self.loops = loops
        self.committed: dict[int, set[int]] = {}
        self.pending: dict[int, dict[int, int]] = {}
        self.index: dict[int, int] = {}

    def apply(self, op: str, slot: int, hashes: list[int]):
        committed = self.committed.setdefault(slot, set())
        pending = self.pending.setdefault(slot, {})
        bit, keep, f = 1 << slot, ~(1 << slot), self.loops[op]
        if op == "promise":
            return f(pending, self.index, bit, hashes)
        if op == "retire":
            return f(pending, committed, self.index, keep, hashes)
        if op == "store":
            return f(committed, pending, self.index, bit, hashes)
        if op == "remove":
            return f(committed, pending, self.index, keep, hashes)
        if op == "committed_prefix":
            return f(committed, hashes)
        raise AssertionError(op)

    def state(self):
        return self.committed, self.pending, self.index


def _loops(suffix: str, module) -> dict:
    names = ("promise", "retire", "store", "remove", "match_groups", "committed_prefix")
    return {n: getattr(module, n + suffix) for n in names}


@needs_native
@pytest.mark.parametrize("slots", [[0, 1, 2, 3], [0, 5, 61, 62, 63, 64, 200]])
def test_block_tables_equal_the_python_reference_over_random_operations(slots):
    """Every answer and every table equal after each of 6,000 random operations: hashes drawn from a small pool (so
    promises stack, retires meet committed blocks, stores meet pending ones), with repeats inside one call, negative
    and 64-bit hashes; slots past 61 make masks that no longer fit a C long."""
    rng = random.Random(f"tables-{slots}")
    pool = [rng.randrange(-2**63, 2**63) for _ in range(40)] + [0, -1, 1]
    native, python = _Tables(_loops("", block_tables.native_block_tables)), _Tables(_loops("_py", block_tables))
    ops = ["promise", "promise", "retire", "store", "remove", "committed_prefix"]
    for step in range(6000):
        op, slot = rng.choice(ops), rng.choice(slots)
        hashes = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        got = native.apply(op, slot, list(hashes))
        want = python.apply(op, slot, list(hashes))
        assert got == want, (step, op, slot)
        assert native.state() == python.state(), (step, op, slot)
        mask = sum(1 << s for s in rng.sample(slots, rng.randint(1, len(slots))))
        chain = rng.sample(pool, rng.randint(0, 10))
        assert (block_tables.native_block_tables.match_groups(native.index, chain, mask)
                == block_tables.match_groups_py(python.index, chain, mask)), step
    assert python.index  # the sequence left blocks held, so the comparisons above saw non-trivial tables


@needs_native
def test_block_tables_accept_any_iterable_and_refuse_what_the_reference_refuses():
    native = block_tables.native_block_tables
    pending, index = {}, {}
    assert native.promise(pending, index, 1, iter([5, 6, 5])) == [5, 6]
    assert pending == {5: 2, 6: 1} and index == {5: 1, 6: 1}
    assert native.retire(pending, set(), index, ~1, (h for h in [5, 6, 6])) == [6]
    assert native.match_groups(index, (), 1) == [] == block_tables.match_groups_py(index, (), 1)
    for promise in (native.promise, block_tables.promise_py):
        with pytest.raises(TypeError):
            promise({}, {}, 1, 5)  # not iterable
        with pytest.raises(TypeError):
            promise({}, {}, 1, [[1]])  # an unhashable hash
    with pytest.raises(TypeError):
        native.store([], pending, index, 1, [1])  # a committed table that is not a set
