"""The router's C loops (``native_page_hash``, ``native_word_pieces``) against their Python references, value for value.

Each runs where the install had a C compiler; here, where one is on PATH, the tests also require that it was built
(an install that silently fell back to Python would otherwise pass everything and run slower)."""

from __future__ import annotations

import hashlib
import random
import shutil

import pytest

from sgl_moe.router.request import block_hash, word_pieces

try:
    from sgl_moe.router.request import native_page_hash
except ImportError:
    native_page_hash = None

HAVE_CC = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))
needs_native = pytest.mark.skipif(not (block_hash.NATIVE and word_pieces.NATIVE),
                                  reason="the C extensions were not built (no C compiler at install)")


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler on PATH: the Python references run, as they should")
def test_the_extensions_were_built_where_a_compiler_is():
    assert block_hash.NATIVE and word_pieces.NATIVE, (
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
