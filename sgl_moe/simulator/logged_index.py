"""The router's ``BlockIndex`` with each mutation reported, for the simulator's memo (``memo``).

Every mutation breaks the certificates of queued jobs that watch a mutated block (``watch``) and calls
``on_touch`` with the slot. ``match_groups`` is remembered
per hash list until a table gains or loses one of the blocks its answer read (the leading blocks up to
the first that no target held any more, or all of them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from sgl_moe.router.block_index import BlockIndex
from sgl_moe.router.job import Job
from sgl_moe.simulator.certificate import Certificate

MATCH_MEMO = 16384
"""Hash lists whose match is remembered (the memo is emptied when full)."""
MATCH_READS = 1 << 22
"""Remembered (block, hash list) dependencies at which the memo is emptied (stale ones pile up)."""


class LoggedBlockIndex(BlockIndex):
    """``BlockIndex`` that reports mutations (and remembers matches until a mutation touches what they read)."""

    def __init__(self) -> None:
        super().__init__()
        self.on_touch: Callable[[int], None] = lambda slot: None
        """Called with the slot after each mutation."""
        self.watch: dict[int, set[Job]] = {}
        """Block hash -> queued jobs whose certificate breaks when any table gains or loses it."""
        self.certificates: dict[Job, Certificate | None] = {}
        """Queued job -> its certificate (None: its last scoring gave none); written by the MemoScheduler."""
        self._live: set[int] = set()
        """Slots added and not removed."""
        self._watched: dict[Job, int] = {}
        """Queued job -> how many of its leading blocks are in ``watch``."""
        self._matches: dict[int, tuple[Sequence[int], int, list[tuple[int, int]]]] = {}
        """id(hash list) -> (the list, the slot mask asked, the answer)."""
        self._readers: dict[int, set[int]] = {}
        """Block hash -> ids of the hash lists whose remembered answer read it."""
        self._reads = 0

    def watch_job(self, job: Job, upto: int) -> None:
        """Break the job's certificates when a table gains or loses any of its first ``upto`` blocks."""
        have = self._watched.get(job, 0)
        if upto > have:
            watch = self.watch
            for h in job.keys[0][have:upto]:
                jobs = watch.get(h)
                if jobs is None:
                    watch[h] = {job}
                else:
                    jobs.add(job)
            self._watched[job] = upto

    def unwatch_job(self, job: Job) -> None:
        """The job left the queue: its blocks are no longer watched for it."""
        have = self._watched.pop(job, 0)
        if have:
            watch = self.watch
            for h in job.keys[0][:have]:
                jobs = watch.get(h)
                if jobs is not None:
                    jobs.discard(job)
                    if not jobs:
                        del watch[h]

    def match_groups(self, hashes: Sequence[int], slots_mask: int) -> list[tuple[int, int]]:
        """``BlockIndex.match_groups``, remembered per hash list until a table gains or loses a block the answer
        read: queued jobs are matched again and again.

        The scan reads blocks until no target is left: up to the longest match and the block after it."""
        if not hashes:
            return []
        key = id(hashes)
        hit = self._matches.get(key)
        if hit is not None and hit[0] is hashes and hit[1] == slots_mask:
            return hit[2]
        groups = super().match_groups(hashes, slots_mask)
        if len(self._matches) >= MATCH_MEMO or self._reads >= MATCH_READS:
            self._forget_matches()
        self._matches[key] = (hashes, slots_mask, groups)
        readers = self._readers
        read = hashes[:groups[0][0] + 1] if groups else hashes[:1]
        self._reads += len(read)
        for h in read:
            ids = readers.get(h)
            if ids is None:
                readers[h] = {key}
            else:
                ids.add(key)
        return groups

    def _forget_matches(self) -> None:
        self._matches.clear()
        self._readers.clear()
        self._reads = 0

    def _touched(self, slot: int, hashes: list[int] | None = None) -> None:
        if hashes is None:
            self._forget_matches()
        elif self._readers:
            pop, matches = self._readers.pop, self._matches
            for h in hashes:
                ids = pop(h, None)
                if ids:
                    for key in ids:
                        matches.pop(key, None)
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
        self._live.add(slot)
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
        # A retire drops promises alone: where every block is committed on the slot (the ledger retires a
        # promise once its blocks are stored) no match and no committed prefix moves, so nothing is reported.
        quiet = slot in self._live and self.all_committed(slot, hashes)
        super().retire(slot, hashes)
        if not quiet:
            self._touched(slot, hashes)

    def clear_committed(self, slot: int) -> int:
        n = super().clear_committed(slot)
        self._touched(slot)
        self._dirty_all()
        return n

    def remove_target(self, slot: int) -> None:
        self._live.discard(slot)
        super().remove_target(slot)
        self._touched(slot)
        self._dirty_all()

    def _dirty_all(self) -> None:
        """A mutation whose hashes are not listed (rare): every certificate that watches blocks breaks."""
        for c in list(self.certificates.values()):
            if c is not None:
                c.dirty()
