"""Committed and pending block tables of every routing target, behind one inverted index.

A *target* is one worker's attention-DP rank (one KV cache). Per target:

- the **committed** table: block hashes the worker reported stored (KV events), removed on
  ``BlockRemoved``, emptied on ``AllBlocksCleared`` or when the event stream cannot be trusted;
- the **pending** table: blocks promised by requests routed there but not yet reported stored,
  reference-counted per request (several requests may promise the same block).

The index maps each hash to a bitmask of the targets holding it in either table, so the longest
prefix match over all targets is one dictionary lookup and a few integer operations per block,
whatever the number of workers (seed 000 §7.2). The loops over a request's blocks are ``block_tables``' (in C
where it was built).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sgl_moe.router.placement import block_tables


class BlockIndex:
    """Owns every target's committed and pending tables; targets are small integer slots.

    Every mutation goes through ``add_target``, ``remove_target``, ``store``, ``remove``, ``clear_committed``,
    ``promise`` or ``retire``. Hook for the simulator: its ``LoggedBlockIndex`` overrides those methods (and
    ``match_groups``) to stamp and report each mutation, and reads ``holders``.
    """

    def __init__(self) -> None:
        self._committed: dict[int, set[int]] = {}
        self._pending: dict[int, dict[int, int]] = {}
        self._index: dict[int, int] = {}
        self._next_slot = 0

    # -- targets ---------------------------------------------------------------------------
    def add_target(self) -> int:
        """A new slot; slots are never reused, so a late retire for a removed target cannot touch another."""
        slot = self._next_slot
        self._next_slot += 1
        self._committed[slot] = set()
        self._pending[slot] = {}
        return slot

    def has_target(self, slot: int) -> bool:
        """Whether the slot was added and not removed."""
        return slot in self._committed

    def remove_target(self, slot: int) -> None:
        """Forget the target entirely."""
        self.clear_committed(slot)
        for h in list(self._pending[slot]):
            self._drop_bit(slot, h)
        del self._committed[slot], self._pending[slot]

    # -- committed table (KV events) ----------------------------------------------------------
    def store(self, slot: int, hashes: Iterable[int]) -> list[int]:
        """Commit ``hashes``; returns those the committed table gained (not already there)."""
        return block_tables.store(self._committed[slot], self._pending[slot], self._index, 1 << slot, hashes)

    def remove(self, slot: int, hashes: Iterable[int]) -> list[int]:
        """Uncommit ``hashes``; returns those the committed table lost (it held them)."""
        return block_tables.remove(self._committed[slot], self._pending[slot], self._index, ~(1 << slot), hashes)

    def clear_committed(self, slot: int) -> int:
        """Empty the committed table; returns how many blocks it held."""
        committed, pending = self._committed[slot], self._pending[slot]
        n = len(committed)
        for h in committed:
            if h not in pending:
                self._drop_bit(slot, h)
        committed.clear()
        return n

    def is_committed(self, slot: int, h: int) -> bool:
        return h in self._committed[slot]

    def all_committed(self, slot: int, hashes: Iterable[int]) -> bool:
        """Whether every hash of ``hashes`` is in the target's committed table."""
        return self._committed[slot].issuperset(hashes)

    # -- pending table (routed requests) -----------------------------------------------------
    def promise(self, slot: int, hashes: Iterable[int]) -> list[int]:
        """One more promise of each hash; returns those the pending table gained (first promise there)."""
        return block_tables.promise(self._pending[slot], self._index, 1 << slot, hashes)

    def retire(self, slot: int, hashes: Iterable[int]) -> list[int] | None:
        """Drop one promise of each hash (the request that made it finished or failed); returns the hashes the
        target no longer holds in either table (their last promise, not committed), None if the target is gone."""
        pending = self._pending.get(slot)
        if pending is None:  # target removed meanwhile
            return None
        return block_tables.retire(pending, self._committed[slot], self._index, ~(1 << slot), hashes)

    # -- queries -----------------------------------------------------------------------------
    def match(self, hashes: Sequence[int], slots_mask: int) -> dict[int, int]:
        """Longest run of leading blocks each target in ``slots_mask`` holds (committed or pending).

        Returns ``{slot: matched_blocks}`` for targets with at least one matched block.
        """
        result: dict[int, int] = {}
        for blocks, mask in self.match_groups(hashes, slots_mask):
            _record(result, mask, blocks)
        return result

    def match_groups(self, hashes: Sequence[int], slots_mask: int) -> list[tuple[int, int]]:
        """The same match as groups: ``(matched_blocks, mask of the targets that matched exactly that many)``,
        longest first, each with at least one block; the masks are disjoint."""
        return block_tables.match_groups(self._index, hashes, slots_mask)

    def holders(self, h: int) -> int:
        """Mask of the targets holding block ``h`` (committed or pending); hook: the simulator's memo reads it."""
        return self._index.get(h, 0)

    def committed_prefix(self, slot: int, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` in the target's committed table alone."""
        return block_tables.committed_prefix(self._committed[slot], hashes)

    def sizes(self, slot: int) -> tuple[int, int]:
        """(committed blocks, pending blocks) of a target."""
        return len(self._committed[slot]), len(self._pending[slot])

    def _drop_bit(self, slot: int, h: int) -> None:
        mask = self._index.get(h, 0) & ~(1 << slot)
        if mask:
            self._index[h] = mask
        else:
            self._index.pop(h, None)


def _record(result: dict[int, int], mask: int, blocks: int) -> None:
    if blocks == 0:
        return
    while mask:
        low = mask & -mask
        result[low.bit_length() - 1] = blocks
        mask ^= low
