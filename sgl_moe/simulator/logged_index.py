"""The router's ``BlockIndex`` with each mutation stamped and reported, for the simulator's memo (``memo``).

Every mutation bumps a version, stamps the slot it touched, breaks the certificates of queued jobs that
watch a mutated block (``watch``) and calls ``on_touch`` with the slot. ``match_groups`` is remembered
per hash list while no target its answer depends on was mutated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from sgl_moe.router.block_index import BlockIndex
from sgl_moe.router.job import Job
from sgl_moe.simulator.certificate import Certificate

MATCH_MEMO = 16384
"""Hash lists whose match is remembered (the memo is emptied when full)."""


class LoggedBlockIndex(BlockIndex):
    """``BlockIndex`` that stamps targets with the version of their last mutation and reports mutations."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 0
        self.stamp: list[int] = []
        """Slot -> version of the last mutation of its tables."""
        self.on_touch: Callable[[int], None] = lambda slot: None
        """Called with the slot after each mutation."""
        self.watch: dict[int, set[Job]] = {}
        """Block hash -> queued jobs whose certificate breaks when any table gains or loses it."""
        self.certificates: dict[Job, Certificate | None] = {}
        """Queued job -> its certificate (None: its last scoring gave none); written by the MemoScheduler."""
        self._matches: dict[int, tuple[Sequence[int], int, int, list[tuple[int, int]], int]] = {}

    def changed_since(self, version: int, mask: int) -> bool:
        """Whether any target in ``mask`` was mutated after ``version``."""
        stamp = self.stamp
        while mask:
            low = mask & -mask
            if stamp[low.bit_length() - 1] > version:
                return True
            mask ^= low
        return False

    def match_groups(self, hashes: Sequence[int], slots_mask: int) -> list[tuple[int, int]]:
        """``BlockIndex.match_groups``, remembered per hash list while no target it depends on (those that
        matched, those holding the first block) is mutated: queued jobs are matched again and again."""
        if not hashes:
            return []
        key = id(hashes)
        hit = self._matches.get(key)
        if hit is not None and hit[0] is hashes and hit[1] == slots_mask and (
                hit[2] == self.version or not self.changed_since(hit[2], hit[4] | self.holders(hashes[0]))):
            return hit[3]
        groups = super().match_groups(hashes, slots_mask)
        matched = 0
        for _, mask in groups:
            matched |= mask
        if len(self._matches) >= MATCH_MEMO:
            self._matches.clear()
        self._matches[key] = (hashes, slots_mask, self.version, groups, matched)
        return groups

    def _touched(self, slot: int, hashes: list[int] | None = None) -> None:
        self.version += 1
        self.stamp[slot] = self.version
        watch = self.watch
        if hashes and watch:
            get, certificate = watch.get, self.certificates.get
            for h in hashes:
                jobs = get(h)
                if jobs:
                    for job in jobs:
                        c = certificate(job)
                        if c is not None:
                            c.dirty()
        self.on_touch(slot)

    def add_target(self) -> int:
        slot = super().add_target()
        self.stamp.extend([0] * (slot + 1 - len(self.stamp)))
        self._touched(slot)
        return slot

    def store(self, slot: int, hashes: Iterable[int]) -> None:
        hashes = list(hashes)
        super().store(slot, hashes)
        self._touched(slot, hashes)

    def promise(self, slot: int, hashes: Iterable[int]) -> None:
        hashes = list(hashes)
        super().promise(slot, hashes)
        self._touched(slot, hashes)

    def remove(self, slot: int, hashes: Iterable[int]) -> None:
        hashes = list(hashes)
        super().remove(slot, hashes)
        self._touched(slot, hashes)

    def retire(self, slot: int, hashes: Iterable[int]) -> None:
        hashes = list(hashes)
        super().retire(slot, hashes)
        if slot < len(self.stamp):
            self._touched(slot, hashes)

    def clear_committed(self, slot: int) -> int:
        n = super().clear_committed(slot)
        self._touched(slot)
        return n

    def remove_target(self, slot: int) -> None:
        super().remove_target(slot)
        self._touched(slot)
