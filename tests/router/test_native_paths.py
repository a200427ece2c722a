"""The router's C loops (``native_page_hash``, ``native_word_pieces``, ``native_block_tables``) against their Python
references, value for value.

Each runs where the install had a C compiler; here, where one is on PATH, the tests also require that it was built
(an install that silently fell back to Python would otherwise pass everything and run slower)."""

from __future__ import annotations

import array
import hashlib
import random
import shutil

import pytest

from sgl_moe.router.placement import block_tables
from sgl_moe.router.request import block_hash, token_cuts, token_ids, word_pieces
from sgl_moe.router.request.token_ids import TokenIds

try:
    from sgl_moe.router.request import native_page_hash
except ImportError:
    native_page_hash = None

HAVE_CC = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))
needs_native = pytest.mark.skipif(not (block_hash.NATIVE and word_pieces.NATIVE and block_tables.NATIVE),
                                  reason="the C extensions were not built (no C compiler at install)")


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler on PATH: the Python references run, as they should")
def test_the_extensions_were_built_where_a_compiler_is():
    assert (block_hash.NATIVE and word_pieces.NATIVE and block_tables.NATIVE and token_cuts.NATIVE
            and token_ids.NATIVE), (
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
            raw, digest = native_page_hash.block_hash_chain_packed(ids, page, seed)  # the router's keys: packed
            assert type(raw) is bytes and raw == array.array("q", want[0]).tobytes() and digest == want[1]
            if len(ids) < page:
                assert got[1] is seed and digest is seed  # nothing hashed: the seed as given, None stays None
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
def test_page_hash_chain_over_packed_ids_equals_the_chain_over_the_list():
    """Ids packed as uint32 (``TokenIds``, a plain ``array`` of ``I`` as a slice of one gives, a memoryview of it)
    are hashed from their buffer to the list's answer, partial page and seed alike; a buffer of another type (signed
    ints, bytes) is read as a sequence of ints, as before."""
    rng = random.Random("packed-ids")
    for _ in range(300):
        page = rng.choice([1, 3, 16, 64])
        ids = [rng.choice([0, 2**31, 2**32 - 1, rng.randrange(2**32)]) for _ in range(rng.randrange(0, 300))]
        seed = rng.choice([None, b"", block_hash.salt_seed("t"), b"z" * 32])
        want = block_hash.block_hash_chain_py(ids, page, seed)
        for packed in (TokenIds("I", ids), array.array("I", ids), memoryview(array.array("I", ids))):
            got = native_page_hash.block_hash_chain(packed, page, seed)
            assert got == want, (page, len(ids), seed, type(packed))
            hashes, digest = block_hash.block_hash_chain_packed(packed, page, seed)
            assert type(hashes) is block_hash.PackedHashes and hashes == want[0] and digest == want[1]
            assert block_hash.block_hash_chain_py(packed, page, seed) == want
            if len(ids) < page:
                assert got[1] is seed
    small = [rng.randrange(2**31) for _ in range(40)]
    assert native_page_hash.block_hash_chain(array.array("i", small), 16) == block_hash.block_hash_chain_py(small, 16)
    assert native_page_hash.block_hash_chain(bytes(range(32)), 16) == block_hash.block_hash_chain_py(range(32), 16)
    with pytest.raises(OverflowError):
        native_page_hash.block_hash_chain(array.array("i", [1, -1]), 2)


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
    with pytest.raises(error):
        native_page_hash.block_hash_chain_packed(ids, 2)


@needs_native
def test_page_hash_refuses_a_page_size_below_one():
    for page in (0, -3):
        with pytest.raises(ValueError, match="page_size must be positive"):
            native_page_hash.block_hash_chain([1, 2], page)
        with pytest.raises(ValueError, match="page_size must be positive"):
            native_page_hash.block_hash_chain_packed([1, 2], page)


# -- word pieces ----------------------------------------------------------------------------------------------------
ALPHABET = ["a", "bc", "é", "日本", "👩\u200d💻", "\n", "\t", " ", "  ", "   ", " " * 5, "x" * 70, ".", "1"]


def _texts(rng: random.Random, n: int) -> list[str]:
    fixed = ["", " ", "  ", "   ", "a", " a", "  a", "a ", "a  ", "a  b", "  a  b  ", "a b c", "é ü", "a\u200d b"]
    return fixed + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def _pieces(text: str) -> list[str]:
    import re

    return re.findall(r" *[^ ]+| +", text)


def _both(rng: random.Random, texts: list[str], share: float, max_pieces: int = 1_000_000, packed: bool = False):
    """The C table and the reference, each keeping the same ids for about ``share`` of the texts' pieces: 0 to 7
    ids a piece, so the C table's three ways of copying a kept piece's ids are all compared (one or two ids inline,
    three or four by ``memcpy`` from the slot, more from the table's ids arena, prefetched when found)."""
    keep = {}
    for piece in sorted({p for t in texts for p in _pieces(t)}):
        if rng.random() < share:
            keep[piece] = [rng.randrange(50_000) for _ in range(rng.randint(0, 7))]
    native = word_pieces.native_word_pieces.PieceTable(max_pieces, 64, packed=packed)
    reference = word_pieces.PieceTablePy(max_pieces, 64, packed=packed)
    native.keep(keep)
    reference.keep(keep)
    return native, reference


def _ids(found):
    """A lookup's or fill's ids as a list (a packed table's are uint32 bytes); "partial" for a partial lookup."""
    if isinstance(found, bytes):
        return array.array("I", found).tolist()
    return found if isinstance(found, list) else "partial"


def _filled(answer):
    ids, unknown = answer
    return (None if ids is None else _ids(ids)), unknown


@needs_native
@pytest.mark.parametrize("packed", [False, True], ids=["lists", "packed"])
@pytest.mark.parametrize("share", [1.0, 0.8, 0.2, 0.0])
def test_piece_table_lookup_equals_the_python_reference(share, packed):
    """Same ids, same new pieces in the same order, same piece count, then the same ids with the new pieces given,
    for texts with runs of spaces at the start, inside and at the end, multi-byte characters, ZWJ sequences and
    pieces longer than any kept one (70 characters: never kept). A packed table answers every ids as the uint32
    bytes of the list the other answers."""
    rng = random.Random(f"pieces-{share}")
    texts = _texts(rng, 3000)
    native, reference = _both(rng, texts, share, packed=packed)
    assert len(native) == len(reference)
    ids_of = {p: [rng.randrange(50_000) for _ in range(rng.randint(1, 3))] for t in texts for p in _pieces(t)}
    for text in texts:
        got, want = native.lookup(text), reference.lookup(text)
        assert isinstance(got[0], bytes) == isinstance(want[0], bytes) == (packed and not got[1])
        assert (_ids(got[0]), *got[1:]) == (_ids(want[0]), *want[1:]), repr(text)
        assert got[2] == len(_pieces(text))
        if not got[1]:
            assert _ids(got[0]) == [i for p in _pieces(text) for i in _ids(native.lookup(p)[0])]
            continue
        if len(got[1]) > 1:
            some = {p: ids_of[p] for p in got[1][::2]}  # half of them: the rest are reported unknown
            assert got[0].fill(some) == want[0].fill(some) == (None, got[1][1::2])
        all_of = {p: ids_of[p] for p in got[1]}
        filled = _filled(got[0].fill(all_of))
        assert filled == _filled(want[0].fill(all_of)) and filled[1] == [], repr(text)
        if packed:
            assert filled[0] == [i for p in _pieces(text) for i in (ids_of[p] if p in all_of
                                                                     else _ids(native.lookup(p)[0]))]


@needs_native
def test_a_packed_fill_refuses_a_fresh_id_outside_uint32():
    table = word_pieces.native_word_pieces.PieceTable(100, 64, packed=True)
    table.keep({"a": [1]})
    partial, new, _ = table.lookup("a b")
    assert new == [" b"]
    with pytest.raises(OverflowError):
        partial.fill({" b": [2**32]})
    with pytest.raises(OverflowError):
        partial.fill({" b": [-1]})
    assert partial.fill({" b": [2**32 - 1, 0]}) == (array.array("I", [1, 2**32 - 1, 0]).tobytes(), [])


@needs_native
def test_a_partial_lookup_is_filled_after_the_table_was_rebuilt():
    """Pieces found kept, then dropped by a ``keep`` that rebuilt the table before ``fill``: reported unknown,
    and with them given, the ids are the text's."""
    table = word_pieces.native_word_pieces.PieceTable(4, 64)
    table.keep({"a": [1], " b": [2], " c": [3]})
    partial, new, count = table.lookup("a b c d")
    assert (new, count) == ([" d"], 4)
    table.keep({" x": [9], " y": [8], " z": [7]})  # four or more: the older half goes
    assert table.lookup("a")[1] == ["a"]
    ids, unknown = partial.fill({" d": [4]})
    assert ids is None and " d" not in unknown and "a" in unknown
    assert partial.fill({" d": [4], "a": [1], " b": [2], " c": [3]}) == ([1, 2, 3, 4], [])


@needs_native
def test_piece_table_keeps_what_it_can_hold_and_drops_the_older_half_when_full():
    table = word_pieces.native_word_pieces.PieceTable(100, 8)
    table.keep({"": [1], " " + "x" * 8: [2], "a": [-1], " b": [2**32], " c": [1.0], " d": [2**32 - 1, 0],
                "日本": [7]})
    assert len(table) == 2  # empty, 9 characters, ids outside uint32 or not ints: not kept
    assert table.lookup(" d日本")[1:] == ([" d日本"], 1)  # one piece: a space and the non-spaces after it
    assert table.lookup("日本 d") == ([7, 2**32 - 1, 0], [], 2)
    for i in range(1000):
        table.keep({f" w{i}": [i]})
        assert len(table) <= 100
    assert table.lookup(" w999 w990") == ([999, 990], [], 2)
    assert table.lookup(" w0")[1] == [" w0"] and table.lookup(" w899")[1] == [" w899"]
    with pytest.raises(UnicodeEncodeError):
        table.lookup("a \ud800 b")
    table.keep({"\ud800": [3]})  # no UTF-8: never kept, never looked up
    with pytest.raises(TypeError):
        table.keep({" e": (1, 2)})
    with pytest.raises(TypeError):
        table.lookup(" e").__getitem__(0).fill({" e": (1, 2)})
    with pytest.raises(ValueError):
        word_pieces.native_word_pieces.PieceTable(0, 8)


@needs_native
def test_piece_table_finds_tens_of_thousands_of_pieces_through_growths_and_rebuilds():
    """Past 16,384 pieces the slots take 2 MB or more, allocated on their own and advised to take huge pages: the
    pieces kept are found with their ids through growths and rebuilds that drop the older half."""
    table = word_pieces.native_word_pieces.PieceTable(60_000, 16)
    for start in range(0, 100_000, 10_000):
        table.keep({f" p{i}": [i, i + 1] for i in range(start, start + 10_000)})
        assert len(table) <= 60_000
    text = "".join(f" p{i}" for i in range(95_000, 100_000))
    assert table.lookup(text) == ([x for i in range(95_000, 100_000) for x in (i, i + 1)], [], 5_000)
    assert table.lookup(" p0")[1] == [" p0"]


@needs_native
def test_piece_table_seeds_its_hash_per_table():
    """Two tables given the same pieces in the same order lay them out differently (the seed), and both find
    all of them: text chosen to collide in one table does not collide in the next one the router makes."""
    keep = {f" p{i}": [i] for i in range(5000)}
    tables = [word_pieces.native_word_pieces.PieceTable(10_000, 64) for _ in range(2)]
    for table in tables:
        table.keep(keep)
        assert len(table) == 5000
        assert table.lookup("".join(keep)) == (list(range(5000)), [], 5000)


# -- block tables ---------------------------------------------------------------------------------------------------
def _state(t) -> tuple:
    """What the tables hold, comparable across the C and Python types (``export`` with sorted committed lists)."""
    next_slot, tables = t.export()
    return next_slot, {s: (sorted(c), p) for s, (c, p) in tables.items()}


@needs_native
@pytest.mark.parametrize("n_slots", [4, 64])
def test_block_tables_equal_the_python_reference_over_random_operations(n_slots):
    """Every answer and every table equal after each of 8,000 random operations: hashes drawn from a small pool (so
    promises stack up to several counts, retires meet committed blocks, stores meet pending ones), repeats inside one
    call, negative and 64-bit hashes, queries with hashes past 64 bits, targets removed and added, the 64th slot;
    stores, removals, promises and retires half the time with the hashes packed (``PackedHashes``: the KV-event
    reader's and a prompt's), answered packed, and the walks half the time over packed hashes too."""
    rng = random.Random(f"tables-{n_slots}")
    pool = [rng.randrange(-2**63, 2**63) for _ in range(60)] + [0, -1, 1, -2**63, 2**63 - 1]
    native, python = block_tables.native_block_tables.BlockTables(), block_tables.BlockTablesPy()
    for _ in range(n_slots):
        assert native.add_target() == python.add_target()
    removed = set()
    ops = ["promise", "promise", "promise", "retire", "retire", "store", "remove", "committed_prefix",
           "all_committed", "is_committed", "sizes", "clear_committed"]
    for step in range(8000):
        live = [s for s in range(n_slots) if s not in removed]
        op = rng.choice(ops)
        slot = rng.choice(live)
        hashes = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        if op == "is_committed":
            args = (slot, rng.choice(pool))
        elif op in ("sizes", "clear_committed"):
            if op == "clear_committed" and rng.random() < 0.9:
                continue
            args = (slot,)
        else:
            args = (slot, list(hashes))
        if op in ("store", "remove", "promise", "retire") and rng.random() < 0.5:  # packed: events', prompts'
            packed = block_tables.PackedHashes("q", hashes)
            answer = getattr(native, op)(slot, packed)
            assert type(answer) is bytes and list(memoryview(answer).cast("q")) == getattr(python, op)(slot, packed), (
                step, op, slot)
        elif op in ("committed_prefix", "all_committed") and rng.random() < 0.5:
            packed = block_tables.PackedHashes("q", hashes)
            assert getattr(native, op)(slot, packed) == getattr(python, op)(slot, hashes), (step, op, slot)
        else:
            assert getattr(native, op)(*args) == getattr(python, op)(*args), (step, op, slot)
        if step % 7 == 0:
            assert _state(native) == _state(python), (step, op, slot)
        mask = sum(1 << s for s in rng.sample(range(n_slots), rng.randint(1, n_slots)))
        chain = rng.sample(pool, rng.randint(0, 10)) + ([2**64 + 5] if rng.random() < 0.05 else [])
        assert native.match_groups(chain, mask) == python.match_groups(chain, mask), step
        if chain and chain[-1] != 2**64 + 5:
            assert native.match_groups(block_tables.PackedHashes("q", chain), mask) == python.match_groups(chain, mask)
        h = rng.choice(pool + [2**70])
        assert native.holders(h) == python.holders(h)
        if step % 1000 == 999 and len(live) > 1:  # a target leaves; its slot is never given again
            gone = rng.choice(live)
            native.remove_target(gone), python.remove_target(gone)
            removed.add(gone)
            assert not native.has_target(gone) and native.retire(gone, [pool[0]]) is None
            assert _state(native) == _state(python)
    assert native.blocks == python.blocks > 0  # the sequence left blocks held: the comparisons saw real tables
    assert any(c for _, (_, c) in python.export()[1].items() if any(n > 2 for n in c.values()))  # counts stacked
    for s in range(n_slots):
        if s not in removed:
            native.remove_target(s), python.remove_target(s)
    assert native.blocks == python.blocks == 0


@needs_native
def test_block_table_walks_longer_than_their_read_ahead_equal_the_reference():
    """``match_groups``, ``committed_prefix`` and ``all_committed`` read a prompt's hashes ahead of their lookups (8 at
    a time, prefetching): over prompts of up to 60 blocks whose match ends anywhere, on and around the read-ahead's
    edges, each answer equals the reference's, over the hashes as a list and packed (``PackedHashes``, a plain
    ``array`` as a slice of one is, an unaligned view); a hash that is not an int raises only once the walk reaches
    it, as the walk hash by hash raised before."""
    native, python = block_tables.native_block_tables.BlockTables(), block_tables.BlockTablesPy()
    for _ in range(3):
        native.add_target(), python.add_target()
    rng = random.Random("walks")
    prompt = [rng.randrange(-2**63, 2**63) for _ in range(60)]
    for t in (native, python):
        t.store(0, prompt[:17])
        t.promise(1, prompt[:8])
        t.store(1, prompt[:3])
        t.store(2, prompt[:60:2])  # every other block: a walk of target 2 stops at its second
    for end in range(61):
        chain = prompt[:end] + [rng.randrange(-2**63, 2**63) for _ in range(rng.randint(0, 20))]
        unaligned = memoryview(bytes(4) + array.array("q", chain).tobytes())[4:].cast("q")
        for hashes in (chain, block_tables.PackedHashes("q", chain), array.array("q", chain), unaligned):
            for mask in (0b1, 0b11, 0b111, 0b110):
                assert native.match_groups(hashes, mask) == python.match_groups(chain, mask), (end, mask)
            for slot in range(3):
                assert native.committed_prefix(slot, hashes) == python.committed_prefix(slot, chain), (end, slot)
                assert native.all_committed(slot, hashes[:end]) == python.all_committed(slot, chain[:end]), (end, slot)
    for walk in (lambda h: native.committed_prefix(0, h), lambda h: native.all_committed(1, h),
                 lambda h: native.match_groups(h, 0b111)):
        assert walk(prompt[:20] + ["not a hash"]) is not None  # past where every walk stops: read ahead, not raised
        with pytest.raises(TypeError):
            walk(prompt[:2] + ["not a hash"])  # reached: target 2 holds blocks 0 and 2, the others the first 3+
    assert native.committed_prefix(0, prompt[:17] + [2**64, "x"]) == 17  # past the key range: absent, not an error


@needs_native
def test_block_tables_grow_through_many_blocks_and_empty_again():
    """200,000 blocks over 3 targets: the table grows many times; removing everything leaves it empty, and the
    answers stay those of the reference."""
    native, python = block_tables.native_block_tables.BlockTables(), block_tables.BlockTablesPy()
    for _ in range(3):
        native.add_target(), python.add_target()
    rng = random.Random("grow")
    hashes = [rng.randrange(-2**63, 2**63) for _ in range(200_000)]
    for t in (native, python):
        t.store(0, hashes[:120_000])
        t.promise(1, hashes[60_000:])
        t.promise(2, hashes[::3])
    assert native.blocks == python.blocks == 200_000
    assert native.sizes(1) == python.sizes(1) == (0, 140_000)
    assert native.match_groups(hashes[:10], 0b111) == python.match_groups(hashes[:10], 0b111)
    for t in (native, python):
        assert t.remove(0, hashes[:120_000]) == hashes[:120_000]
        t.retire(1, hashes[60_000:])
    assert native.retire(2, hashes[::3]) == python.retire(2, hashes[::3])
    assert native.blocks == python.blocks == 0


@needs_native
def test_block_tables_accept_any_iterable_and_refuse_what_the_reference_refuses():
    native, python = block_tables.native_block_tables.BlockTables(), block_tables.BlockTablesPy()
    for t in (native, python):
        a = t.add_target()
        assert t.promise(a, iter([5, 6, 5])) == [5, 6]
        assert t.retire(a, (h for h in [5, 6, 6])) == [6]
        assert t.match_groups((), 1) == []
        assert t.retire(7, [5]) is None  # a target that is not there
        for method, args in (("promise", (a, 5)), ("store", (a, None))):
            with pytest.raises(TypeError):
                getattr(t, method)(*args)  # not iterable
        for method, args in (("store", (9, [1])), ("sizes", (9,)), ("committed_prefix", (9, [1]))):
            with pytest.raises(KeyError):
                getattr(t, method)(*args)  # no such target
    with pytest.raises(OverflowError):
        native.promise(0, [1, 2**63])  # outside the C type's range: refused, nothing changed
    assert native.sizes(0) == (0, 1) and native.holders(1) == 0


@needs_native
def test_block_index_moves_to_the_python_tables_past_the_c_limits_with_the_same_contents(caplog):
    """A hash past 64 bits, or a 65th target, moves ``BlockIndex`` to the Python tables once, holding the same
    blocks, and says so in the log; the answers go on as the reference's."""
    from sgl_moe.router.placement.block_index import BlockIndex

    for trigger in ("hash", "slot"):
        caplog.clear()
        ix, ref = BlockIndex(), BlockIndex(native=False)
        for t in (ix, ref):
            a, b = t.add_target(), t.add_target()
            t.store(a, [1, 2, 3])
            t.promise(b, [1, 2])
            t.promise(b, [1])
        if trigger == "hash":
            assert ix.store(a, [4, 2**64]) == ref.store(a, [4, 2**64]) == [4, 2**64]
        else:
            for _ in range(70):
                assert ix.add_target() == ref.add_target()
        assert not ix.native
        moved = [r.getMessage() for r in caplog.records if "moved from C to Python" in r.getMessage()]
        assert len(moved) == 1 and ("65th target" if trigger == "slot" else "64-bit range") in moved[0], moved
        assert ix.match([1, 2, 3, 4], 0b11) == ref.match([1, 2, 3, 4], 0b11)
        assert ix.retire(b, [1, 2]) == ref.retire(b, [1, 2]) == [2]
        assert ix.sizes(a) == ref.sizes(a) and ix.sizes(b) == ref.sizes(b) == (0, 1)
        assert ix.blocks == ref.blocks
