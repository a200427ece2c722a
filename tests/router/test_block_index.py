"""Committed/pending tables and the longest-prefix match over all targets."""

from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger


def _mask(*slots):
    m = 0
    for s in slots:
        m |= 1 << s
    return m


def test_longest_prefix_per_target():
    ix = BlockIndex()
    a, b, c = ix.add_target(), ix.add_target(), ix.add_target()
    ix.store(a, [1, 2, 3])
    ix.store(b, [1, 2])
    ix.promise(c, [1])
    ix.store(c, [3])  # not a prefix: block 3 without 1..2 does not count beyond the first miss
    assert ix.match([1, 2, 3, 4], _mask(a, b, c)) == {a: 3, b: 2, c: 1}
    assert ix.match([1, 2, 3, 4], _mask(b)) == {b: 2}
    assert ix.match([9, 1], _mask(a, b, c)) == {}
    assert ix.match([], _mask(a)) == {}


def test_remove_and_clear_keep_pending():
    ix = BlockIndex()
    a = ix.add_target()
    ix.store(a, [1, 2])
    ix.promise(a, [2])
    ix.remove(a, [2])
    assert ix.match([1, 2], _mask(a)) == {a: 2}  # still promised
    ix.retire(a, [2])
    assert ix.match([1, 2], _mask(a)) == {a: 1}
    assert ix.clear_committed(a) == 1
    assert ix.match([1], _mask(a)) == {}
    assert ix.sizes(a) == (0, 0)


def test_promises_are_reference_counted():
    ix = BlockIndex()
    a = ix.add_target()
    ix.promise(a, [5])
    ix.promise(a, [5])
    ix.retire(a, [5])
    assert ix.match([5], _mask(a)) == {a: 1}
    ix.retire(a, [5])
    assert ix.match([5], _mask(a)) == {}
    ix.retire(a, [5])  # extra retire is harmless
    assert ix.sizes(a) == (0, 0)


def test_removed_target_leaves_no_trace_and_slot_is_not_reused():
    ix = BlockIndex()
    a, b = ix.add_target(), ix.add_target()
    ix.store(a, [1, 2])
    ix.promise(a, [3])
    ix.store(b, [1])
    ix.remove_target(a)
    assert ix.match([1, 2], _mask(a, b)) == {b: 1}
    assert ix._index == {1: 1 << b}
    c = ix.add_target()
    assert c not in (a, b)
    ix.retire(a, [3])  # a late retire for the removed target touches nothing


def test_ledger_retires_after_completion_and_store():
    ix = BlockIndex()
    a = ix.add_target()
    ledger = PendingLedger(ix, ttl_s=10)
    p = ledger.promise("r1", a, [1, 2])
    ix.store(a, [1])
    ledger.on_stored(a)
    assert ix.sizes(a) == (1, 2)  # not completed yet
    ledger.complete(p, now=100.0)
    assert ix.sizes(a) == (1, 2)  # completed, block 2 not yet stored
    ix.store(a, [2])
    ledger.on_stored(a)
    assert ix.sizes(a) == (2, 0)
    assert ledger.stats.retired_stored == 1


def test_ledger_ttl_and_failure():
    ix = BlockIndex()
    a = ix.add_target()
    ledger = PendingLedger(ix, ttl_s=5)
    p = ledger.promise("r1", a, [1])
    ledger.complete(p, now=100.0)
    assert ledger.expire(now=104.0) == 0
    assert ledger.expire(now=105.0) == 1
    assert ix.sizes(a) == (0, 0)
    q = ledger.promise("r2", a, [7])
    ledger.fail(q)
    assert ix.sizes(a) == (0, 0) and ledger.stats.retired_failed == 1
