"""Committed/pending tables and the longest-prefix match over all targets."""

import random

import pytest

from sgl_moe.router.placement import block_tables
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.block_tables import PackedHashes
from sgl_moe.router.placement.pending import PendingLedger, Promise


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
    assert ix.holders(1) == 1 << b and ix.holders(2) == ix.holders(3) == 0 and ix.blocks == 1
    c = ix.add_target()
    assert c not in (a, b)
    ix.retire(a, [3])  # a late retire for the removed target touches nothing


def test_ledger_retires_after_completion_and_store():
    ix = BlockIndex()
    a = ix.add_target()
    ledger = PendingLedger(ix, ttl_s=10)
    p = ledger.promise("r1", a, [1, 2])
    ledger.on_stored(a, ix.store(a, [1]))
    assert ix.sizes(a) == (1, 2)  # not completed yet
    ledger.complete(p, now=100.0)
    assert ix.sizes(a) == (1, 2)  # completed, block 2 not yet stored
    ledger.on_stored(a, ix.store(a, [2]))
    assert ix.sizes(a) == (2, 0)
    assert ledger.stats.retired_stored == 1


def test_a_request_that_ends_after_its_worker_was_removed_settles_without_error():
    """``DELETE /workers/{id}`` (or a scale-down) while requests run there: the target's tables are purged at once;
    the requests' promises, completed or failed later, touch nothing (a KeyError here reached the client before)."""
    ix = BlockIndex()
    a, b = ix.add_target(), ix.add_target()
    ledger = PendingLedger(ix, ttl_s=5)
    done, failed, other = ledger.promise("r1", a, [1, 2]), ledger.promise("r2", a, [3]), ledger.promise("r3", b, [1])
    ix.remove_target(a)
    ledger.forget_slot(a)
    ledger.complete(done, now=1.0)
    ledger.fail(failed)
    assert done.retired and failed.retired and not ix.has_target(a)
    assert ledger.expire(now=100.0) == 0 and ix.sizes(b) == (0, 1)  # the other worker's promise is untouched
    ledger.complete(other, now=100.0)
    ledger.on_stored(b, ix.store(b, [1]))
    assert other.retired and ix.sizes(b) == (1, 0)


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


class _CheckEveryWaiter:
    """The rule the ledger keeps, written the slow way (its implementation before 2026-11-28): after every stored
    batch, every completed promise of the target is retired if all its blocks are committed."""

    def __init__(self, ix: BlockIndex, ttl_s: float) -> None:
        self.ix, self.ttl_s, self.waiting, self.retired = ix, ttl_s, [], set()

    def complete(self, p, now):
        p.completed_at = now
        if self.ix.all_committed(p.slot, p.keys):
            self._retire(p)
        else:
            self.waiting.append(p)

    def on_stored(self, slot):
        for p in [p for p in self.waiting if p.slot == slot and self.ix.all_committed(slot, p.keys)]:
            self.waiting.remove(p)
            self._retire(p)

    def expire(self, now):
        for p in [p for p in self.waiting if now - p.completed_at >= self.ttl_s]:
            self.waiting.remove(p)
            self._retire(p)

    def _retire(self, p):
        self.ix.retire(p.slot, p.keys)
        self.retired.add(p.rid)


@pytest.mark.parametrize("seed", range(6))
def test_ledger_retires_exactly_when_checking_every_waiter_after_every_batch_would(seed):
    """Random promises, completions, failures, stored batches (with the same block twice, or stored and removed in
    one batch), evictions, resets and TTL expiries on two targets: the ledger (waiters woken by the blocks a batch
    stored) retires the same promises at the same step as checking every waiter after every batch, and leaves the
    same tables."""
    rng = random.Random(seed)
    ix, ref_ix = BlockIndex(), BlockIndex()
    slots = [ix.add_target() for _ in range(2)]
    assert slots == [ref_ix.add_target() for _ in range(2)]
    ledger, ref = PendingLedger(ix, ttl_s=50), _CheckEveryWaiter(ref_ix, ttl_s=50)
    retired: set[str] = set()

    class Seen:
        def promised(self, p):
            pass

        def retired(self, p):
            retired.add(p.rid)

    ledger.observer = Seen()
    running, pool = [], list(range(30))
    for step in range(3000):
        op, slot, now = rng.random(), rng.choice(slots), float(step)
        if op < 0.25:
            keys = [rng.choice(pool) for _ in range(rng.randint(0, 6))]
            p = ledger.promise(f"r{step}", slot, keys)
            q = Promise(p.rid, slot, keys)
            ref_ix.promise(slot, keys)
            running.append((p, q))
        elif op < 0.45 and running:
            p, q = running.pop(rng.randrange(len(running)))
            if rng.random() < 0.1:
                ledger.fail(p)
                ref._retire(q)
            else:
                ledger.complete(p, now=now)
                ref.complete(q, now)
        elif op < 0.75:
            batch = [rng.choice(pool) for _ in range(rng.randint(1, 8))]
            gained = ix.store(slot, batch)
            ref_ix.store(slot, batch)
            if rng.random() < 0.2:  # a removal in the same batch, after the store
                gone = rng.sample(batch, 1)
                ix.remove(slot, gone)
                ref_ix.remove(slot, gone)
            ledger.on_stored(slot, gained)
            ref.on_stored(slot)
        elif op < 0.93:
            gone = rng.sample(pool, rng.randint(1, 4))
            ix.remove(slot, gone)
            ref_ix.remove(slot, gone)
        elif op < 0.96:
            ix.clear_committed(slot)
            ref_ix.clear_committed(slot)
        else:
            ledger.expire(now=now)
            ref.expire(now)
        assert retired == ref.retired, step
        assert [ix.sizes(s) for s in slots] == [ref_ix.sizes(s) for s in slots], step
    assert len(retired) > 100  # the sequence retired promises both ways (stored and TTL), not only by failure


def test_packed_hashes_equal_the_list_of_their_ints():
    ints = [1, -2, 2**63 - 1, -2**63]
    packed = PackedHashes("q", ints)
    assert packed == ints and ints == packed and not packed != ints and packed == PackedHashes("q", ints)
    assert packed != ints[:3] and packed != [1, -2, 0, 0] and len(packed) == 4 and list(packed) == ints
    with pytest.raises(TypeError):
        hash(packed)


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=pytest.mark.skipif(
    not block_tables.NATIVE, reason="native_block_tables not built"))])
def test_packed_hashes_are_stored_and_removed_as_their_list_is(native):
    """What the KV-event reader hands on (``PackedHashes``) commits and uncommits exactly as the same list: the same
    answers (packed from the C tables), holders and matches."""
    rng = random.Random(3)
    packed_index, list_index = BlockIndex(native=native), BlockIndex(native=native)
    slots = [packed_index.add_target() for _ in range(3)]
    assert slots == [list_index.add_target() for _ in range(3)]
    pool = [rng.randrange(-2**63, 2**63) for _ in range(40)]
    for _ in range(400):
        slot, hashes = rng.choice(slots), [rng.choice(pool) for _ in range(rng.randrange(8))]
        op = rng.choice(["store", "store", "remove", "promise"])
        if op == "promise":
            assert packed_index.promise(slot, hashes) == list_index.promise(slot, hashes)
            continue
        got = getattr(packed_index, op)(slot, PackedHashes("q", hashes))
        assert got == getattr(list_index, op)(slot, hashes) and (type(got) is PackedHashes) == native
        assert all(packed_index.holders(h) == list_index.holders(h) for h in pool)
    chain = rng.sample(pool, 10)
    assert packed_index.match_groups(chain, _mask(*slots)) == list_index.match_groups(chain, _mask(*slots))
