"""Committed and pending block tables of every routing target, behind one inverted index.

A *target* is one worker's attention-DP rank (one KV cache). Per target:

- the **committed** table: block hashes the worker reported stored (KV events), removed on
  ``BlockRemoved``, emptied on ``AllBlocksCleared`` or when the event stream cannot be trusted;
- the **pending** table: blocks promised by requests routed there but not yet reported stored,
  reference-counted per request (several requests may promise the same block).

The index maps each hash to a bitmask of the targets holding it in either table, so the longest
prefix match over all targets is one dictionary lookup and a few integer operations per block,
whatever the number of workers (seed 000 §7.2). The tables are ``block_tables``' (in C where it was built).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from sgl_moe.router.placement import block_tables

log = logging.getLogger("sgl_moe.router.placement")


class BlockIndex:
    """Owns every target's committed and pending tables; targets are small integer slots.

    The tables are ``block_tables``' (the C type where it was built; ``native`` False: the Python reference). The C
    type holds slots 0-63 and signed 64-bit hashes: a 65th target, or a hash stored or promised past that range,
    moves the tables to the Python ones once (``_to_python``), with the same contents and answers.

    Every mutation goes through ``add_target``, ``remove_target``, ``store``, ``remove``, ``clear_committed``,
    ``promise`` or ``retire``. Hook for the simulator: its ``LoggedBlockIndex`` overrides those methods (and
    ``match_groups``) to stamp and report each mutation, and reads ``holders``.
    """

    def __init__(self, native: bool | None = None) -> None:
        self._tables = block_tables.new_block_tables(native)

    @property
    def native(self) -> bool:
        """Whether the C tables hold the blocks now."""
        return not isinstance(self._tables, block_tables.BlockTablesPy)

    def _to_python(self, why: str) -> None:
        """Go on with the Python tables, holding what the C ones hold (a target or a hash past their limits)."""
        self._tables = block_tables.BlockTablesPy.from_export(self._tables.export())
        log.warning("block tables moved from C to Python (%s); answers are unchanged, placement costs more CPU "
                    "from now on (%d blocks moved)", why, self._tables.blocks)

    # -- targets ---------------------------------------------------------------------------
    def add_target(self) -> int:
        """A new slot; slots are never reused, so a late retire for a removed target cannot touch another."""
        try:
            return self._tables.add_target()
        except OverflowError:  # the C tables' 64 slots are used up
            self._to_python("a 65th target: the C tables hold slots 0-63")
            return self._tables.add_target()

    def has_target(self, slot: int) -> bool:
        """Whether the slot was added and not removed."""
        return self._tables.has_target(slot)

    def remove_target(self, slot: int) -> None:
        """Forget the target entirely."""
        self._tables.remove_target(slot)

    # -- committed table (KV events) ----------------------------------------------------------
    def store(self, slot: int, hashes: Iterable[int]) -> Sequence[int]:
        """Commit ``hashes``; returns those the committed table gained (not already there). ``PackedHashes`` (the
        KV-event reader's) come back packed from the C tables."""
        try:
            return _unpacked(self._tables.store(slot, hashes))
        except OverflowError:  # a hash outside the C tables' range (nothing was changed)
            self._to_python("a stored block hash outside the signed 64-bit range")
            return self._tables.store(slot, hashes)

    def remove(self, slot: int, hashes: Iterable[int]) -> Sequence[int]:
        """Uncommit ``hashes``; returns those the committed table lost (it held them), packed as ``store``'s."""
        return _unpacked(self._tables.remove(slot, hashes))

    def clear_committed(self, slot: int) -> int:
        """Empty the committed table; returns how many blocks it held."""
        return self._tables.clear_committed(slot)

    def is_committed(self, slot: int, h: int) -> bool:
        return self._tables.is_committed(slot, h)

    def all_committed(self, slot: int, hashes: Iterable[int]) -> bool:
        """Whether every hash of ``hashes`` is in the target's committed table."""
        return self._tables.all_committed(slot, hashes)

    # -- pending table (routed requests) -----------------------------------------------------
    def promise(self, slot: int, hashes: Iterable[int]) -> Sequence[int]:
        """One more promise of each hash; returns those the pending table gained (first promise there), packed as
        ``store``'s."""
        try:
            return _unpacked(self._tables.promise(slot, hashes))
        except OverflowError:  # a hash outside the C tables' range (nothing was changed)
            self._to_python("a promised block hash outside the signed 64-bit range")
            return self._tables.promise(slot, hashes)

    def retire(self, slot: int, hashes: Iterable[int]) -> Sequence[int] | None:
        """Drop one promise of each hash (the request that made it finished or failed); returns the hashes the
        target no longer holds in either table (their last promise, not committed), packed as ``store``'s, None if
        the target is gone."""
        return _unpacked(self._tables.retire(slot, hashes))

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
        return self._tables.match_groups(hashes, slots_mask)

    def holders(self, h: int) -> int:
        """Mask of the targets holding block ``h`` (committed or pending); hook: the simulator's memo reads it."""
        return self._tables.holders(h)

    def committed_prefix(self, slot: int, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` in the target's committed table alone."""
        return self._tables.committed_prefix(slot, hashes)

    def sizes(self, slot: int) -> tuple[int, int]:
        """(committed blocks, pending blocks) of a target."""
        return self._tables.sizes(slot)

    @property
    def blocks(self) -> int:
        """Distinct blocks held by any target (committed or pending)."""
        return self._tables.blocks


def _record(result: dict[int, int], mask: int, blocks: int) -> None:
    if blocks == 0:
        return
    while mask:
        low = mask & -mask
        result[low.bit_length() - 1] = blocks
        mask ^= low


def _unpacked(answer: Sequence[int] | bytes) -> Sequence[int]:
    """A C table's answer to packed hashes (a ``bytes`` of int64s) as ``PackedHashes``; any other as it is."""
    return block_tables.PackedHashes("q", answer) if type(answer) is bytes else answer
