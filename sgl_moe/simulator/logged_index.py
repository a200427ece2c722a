"""The router's ``BlockIndex`` with each mutation reported, for the simulator's memo (``memo``).

Every mutation that makes a table gain or lose blocks (``BlockIndex`` returns which) breaks the certificates of
queued jobs that watch one of them (``watch``) and calls ``on_touch`` with the slot; a promise counted again or
retired while others remain changes no table and is not reported. ``match_groups`` is remembered per hash list
until a mutation may move it (``match_memo``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.job import Job
from sgl_moe.simulator.certificate import Certificate
from sgl_moe.simulator.match_memo import MatchMemo


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
        self._matches = MatchMemo()
        self.defer_puts = False
        """Set by the memo while it scores a job: a match computed then is remembered (``MatchMemo.put``) only if
        asked again or kept (``keep_last_match``: the job stayed queued) before any mutation. Most scorings place
        their job, whose own promise then moves the tables: remembering those matches would be wasted."""
        self._fresh_match: tuple[Sequence[int], int, list[tuple[int, int]]] | None = None
        """The last match computed and not yet remembered (``defer_puts``), while no mutation followed it."""

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
        """``BlockIndex.match_groups``, remembered per hash list until a mutation may move it (``MatchMemo``):
        queued jobs are matched again and again."""
        if not hashes:
            return []
        groups = self._matches.get(hashes, slots_mask)
        if groups is None:
            last = self._fresh_match
            if last is not None and last[0] is hashes and last[1] == slots_mask:
                groups = last[2]
                self._fresh_match = None
                self._matches.put(hashes, slots_mask, groups)
            else:
                groups = super().match_groups(hashes, slots_mask)
                if self.defer_puts:
                    self._fresh_match = (hashes, slots_mask, groups)
                else:
                    self._matches.put(hashes, slots_mask, groups)
        return groups

    def keep_last_match(self) -> None:
        """Remember the last match computed if no mutation followed it (its job stays queued: asked again later)."""
        last = self._fresh_match
        if last is not None:
            self._fresh_match = None
            self._matches.put(*last)

    def _touched(self, slot: int, hashes: Collection[int] | None = None) -> None:
        """Break the certificates watching ``hashes``, gained or lost on ``slot`` (None: unlisted), and tell
        ``on_touch``."""
        watch = self.watch
        if hashes and watch:
            certificate = self.certificates.get
            for h in watch.keys() & hashes:
                for job in watch[h]:
                    c = certificate(job)
                    if c is not None:
                        c.dirty()
        self.on_touch(slot)

    def add_target(self) -> int:
        slot = super().add_target()
        self._fresh_match = None
        self._live.add(slot)
        self._matches.clear()
        self._touched(slot)
        return slot

    # Each mutation reports the blocks a table gained or lost; a promise counted again, or retired while others
    # remain or while the block is committed, moves nothing.
    def store(self, slot: int, hashes: Iterable[int]) -> list[int]:
        gained = super().store(slot, hashes)
        self._fresh_match = None
        if gained:
            self._matches.gained(gained)
            self._touched(slot, gained)
        return gained

    def promise(self, slot: int, hashes: Iterable[int]) -> list[int]:
        gained = super().promise(slot, hashes)
        self._fresh_match = None
        if gained:
            self._matches.gained(gained)
            self._touched(slot, gained)
        return gained

    def remove(self, slot: int, hashes: Iterable[int]) -> list[int]:
        lost = super().remove(slot, hashes)
        self._fresh_match = None
        if lost:
            self._matches.lost(slot)
            self._touched(slot, lost)
        return lost

    def retire(self, slot: int, hashes: Iterable[int]) -> list[int] | None:
        dropped = super().retire(slot, hashes)  # (None: the target is gone, and its removal was reported)
        self._fresh_match = None
        if dropped:
            self._matches.lost(slot)
            self._touched(slot, dropped)
        return dropped

    def clear_committed(self, slot: int) -> int:
        n = super().clear_committed(slot)
        self._fresh_match = None
        self._matches.clear()
        self._touched(slot)
        self._dirty_all()
        return n

    def remove_target(self, slot: int) -> None:
        self._live.discard(slot)
        super().remove_target(slot)
        self._fresh_match = None
        self._matches.clear()
        self._touched(slot)
        self._dirty_all()

    def _dirty_all(self) -> None:
        """A mutation whose hashes are not listed (rare): every certificate that watches blocks breaks."""
        for c in list(self.certificates.values()):
            if c is not None:
                c.dirty()
