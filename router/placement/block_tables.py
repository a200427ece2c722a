"""Every target's committed and pending block tables and the inverted index over them: ``BlockIndex``'s storage.

A target is a small integer slot. Its committed table is the set of block hashes its KV events reported stored; its
pending table maps a hash to the number of routed requests that promised it. The index maps each hash to a mask of
the targets holding it in either table (bit ``slot``), so a longest-prefix match over all targets is one lookup and
a few integer operations per block.

``BlockTablesPy`` is the reference, on plain Python containers. ``native_block_tables.BlockTables``
(``native_block_tables.c``, built at install) has the same methods and answers in one open-addressing table of
24-byte entries; it holds slots 0-63 and signed 64-bit hashes, and ``BlockIndex`` moves to ``BlockTablesPy``
(``from_export``) when a target or a hash goes past that. ``NATIVE`` says whether the C type was built; its tests
(``tests/router/test_native_paths.py``) compare both over random operation sequences.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sgl_moe.router.request.block_hash import PackedHashes

try:
    from sgl_moe.router.placement import native_block_tables
except ImportError:  # no C compiler at install: the Python tables below
    native_block_tables = None

NATIVE = native_block_tables is not None

__all__ = ["NATIVE", "BlockTablesPy", "PackedHashes", "new_block_tables"]


class BlockTablesPy:
    """The tables on Python containers; every method changes them exactly as its docstring says."""

    def __init__(self) -> None:
        self.committed: dict[int, set[int]] = {}
        self.pending: dict[int, dict[int, int]] = {}
        self.index: dict[int, int] = {}
        self.next_slot = 0

    @classmethod
    def from_export(cls, exported: tuple[int, dict[int, tuple[list[int], dict[int, int]]]]) -> BlockTablesPy:
        """The tables ``BlockTables.export`` gave (the C type's contents, to go on past its limits)."""
        next_slot, tables = exported
        t = cls()
        t.next_slot = next_slot
        for slot, (committed, pending) in tables.items():
            t.committed[slot], t.pending[slot] = set(committed), dict(pending)
            bit = 1 << slot
            for h in t.committed[slot].union(pending):
                t.index[h] = t.index.get(h, 0) | bit
        return t

    @property
    def blocks(self) -> int:
        """Distinct blocks held by any target."""
        return len(self.index)

    # -- targets ---------------------------------------------------------------------------------------------------
    def add_target(self) -> int:
        """A new slot; slots are never reused, so a late retire for a removed target cannot touch another."""
        slot = self.next_slot
        self.next_slot += 1
        self.committed[slot] = set()
        self.pending[slot] = {}
        return slot

    def has_target(self, slot: int) -> bool:
        """Whether the slot was added and not removed."""
        return slot in self.committed

    def remove_target(self, slot: int) -> None:
        """Forget the target entirely."""
        self.clear_committed(slot)
        keep = ~(1 << slot)
        for h in self.pending[slot]:
            self._drop_bit(keep, h)
        del self.committed[slot], self.pending[slot]

    # -- committed tables (KV events) ------------------------------------------------------------------------------
    def store(self, slot: int, hashes: Iterable[int]) -> list[int]:
        """Commit the hashes; returns those the committed table gained (not already there)."""
        committed, pending = self.committed[slot], self.pending[slot]
        gained = [h for h in hashes if h not in committed]
        committed.update(gained)
        index, bit = self.index, 1 << slot
        for h in gained:
            if h not in pending:  # (a pending block already has the target's bit)
                index[h] = index.get(h, 0) | bit
        return gained

    def remove(self, slot: int, hashes: Iterable[int]) -> list[int]:
        """Uncommit the hashes; returns those the committed table lost (it held them)."""
        committed, pending = self.committed[slot], self.pending[slot]
        lost = [h for h in hashes if h in committed]
        committed.difference_update(lost)
        keep = ~(1 << slot)
        for h in lost:
            if h not in pending:
                self._drop_bit(keep, h)
        return lost

    def clear_committed(self, slot: int) -> int:
        """Empty the committed table; returns how many blocks it held."""
        committed, pending = self.committed[slot], self.pending[slot]
        n, keep = len(committed), ~(1 << slot)
        for h in committed:
            if h not in pending:
                self._drop_bit(keep, h)
        committed.clear()
        return n

    def is_committed(self, slot: int, h: int) -> bool:
        """Whether ``h`` is in the target's committed table."""
        return h in self.committed[slot]

    def all_committed(self, slot: int, hashes: Iterable[int]) -> bool:
        """Whether every hash is in the target's committed table."""
        return self.committed[slot].issuperset(hashes)

    def committed_prefix(self, slot: int, hashes: Iterable[int]) -> int:
        """How many leading hashes are in the target's committed table."""
        committed, n = self.committed[slot], 0
        for h in hashes:
            if h not in committed:
                break
            n += 1
        return n

    # -- pending tables (routed requests) --------------------------------------------------------------------------
    def promise(self, slot: int, hashes: Iterable[int]) -> list[int]:
        """One more promise of each hash; returns those the pending table gained (first promise there)."""
        pending, index, bit = self.pending[slot], self.index, 1 << slot
        gained = []
        for h in hashes:
            n = pending.get(h, 0)
            pending[h] = n + 1
            if not n:
                index[h] = index.get(h, 0) | bit
                gained.append(h)
        return gained

    def retire(self, slot: int, hashes: Iterable[int]) -> list[int] | None:
        """One promise fewer of each hash; returns those the target no longer holds (their last promise, not
        committed), None if the target is gone."""
        pending = self.pending.get(slot)
        if pending is None:
            return None
        committed, keep = self.committed[slot], ~(1 << slot)
        dropped = []
        for h in hashes:
            n = pending.get(h, 0)
            if n > 1:
                pending[h] = n - 1
            elif n == 1:
                del pending[h]
                if h not in committed:
                    self._drop_bit(keep, h)
                    dropped.append(h)
        return dropped

    # -- queries ---------------------------------------------------------------------------------------------------
    def match_groups(self, hashes: Sequence[int], slots_mask: int) -> list[tuple[int, int]]:
        """``(matched_blocks, mask of the targets in slots_mask that hold exactly that many leading blocks)``,
        longest first, each with at least one block; the masks are disjoint."""
        groups: list[tuple[int, int]] = []
        live = slots_mask
        get = self.index.get
        for i, h in enumerate(hashes):
            have = get(h, 0) & live
            if have != live:
                if i:
                    groups.append((i, live ^ have))  # the targets that dropped out here (``have`` is within ``live``)
                live = have
                if not live:
                    break
        else:
            if live and hashes:
                groups.append((len(hashes), live))
        groups.reverse()
        return groups

    def holders(self, h: int) -> int:
        """Mask of the targets holding block ``h`` (committed or pending)."""
        return self.index.get(h, 0)

    def sizes(self, slot: int) -> tuple[int, int]:
        """(committed blocks, pending blocks) of a target."""
        return len(self.committed[slot]), len(self.pending[slot])

    def export(self) -> tuple[int, dict[int, tuple[list[int], dict[int, int]]]]:
        """``(next_slot, {slot: (committed hashes, {hash: promises})})``, as the C type's ``export``."""
        return self.next_slot, {s: (list(self.committed[s]), dict(self.pending[s])) for s in self.committed}

    def _drop_bit(self, keep: int, h: int) -> None:
        mask = self.index.get(h, 0) & keep
        if mask:
            self.index[h] = mask
        else:
            self.index.pop(h, None)


def new_block_tables(native: bool | None = None) -> Any:
    """Empty tables: the C type where it was built (``native`` None or True), else ``BlockTablesPy``."""
    if native is None:
        native = NATIVE
    if native and native_block_tables is None:
        raise RuntimeError("the C block tables (native_block_tables) were not built")
    return native_block_tables.BlockTables() if native else BlockTablesPy()
