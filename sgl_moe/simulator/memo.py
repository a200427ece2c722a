"""The router's Scheduler, minus re-scoring queued jobs whose answer cannot have changed.

Why: ``Scheduler.pump`` re-scores up to ``PUMP_SCAN_LIMIT`` queued jobs on every release and every
stored-blocks event. When a worker's batch finishes, each of its releases re-scores the same waiting
jobs: ~240 scorings per request in an offline run at 64 workers (the real router pays that CPU too).

A ``longest_block_match`` job that scoring left in the queue gets a certificate that lists what its
answer depends on; events that touch any of it mark the certificate dirty as they happen.

* **Held on its best worker** (the best has room, but the matched blocks are only promised there):
  the answer depends on the job's own blocks in every table (which worker matches deepest, what is
  committed), the loads of the deepest-matching workers if there are several (which one is best),
  whether the best still has room, and the prefix-wait time limit.
* **Waiting** (its best is saturated and spilling does not pay yet), or held elsewhere: on the loads
  and tables of every worker holding a prefix of it (``M``), on no other worker gaining its first
  block, on the queued cost ahead of it for the worker it waits for (checked when it comes up), on
  both time limits, and, when no worker of ``M`` had room, on no worker without a match becoming
  cheaper than waiting (``inflight + cost < wait_finish``, the router's spill test).

``pump`` then visits only the jobs of its scan window that are new, dirty, or past a time limit, in
queue order, with the same room test, window and running sums as ``Scheduler.pump``: every other
job would be scored "still waiting" and change nothing. Everything else is the router's code;
``tests/simulator`` checks that runs with and without the memo place alike.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from sgl_moe.router.block_index import BlockIndex
from sgl_moe.router.candidates import job_cost
from sgl_moe.router.job import Job, Placement
from sgl_moe.router.load_order import LoadOrder
from sgl_moe.router.scheduler import PUMP_SCAN_LIMIT, Scheduler
from sgl_moe.router.worker import Worker

MATCH_MEMO = 16384
"""Hash lists whose match is remembered (the memo is emptied when full)."""
COLLECT_AT = 65536
"""Watch-list size at which certificates that no longer hold are dropped."""


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
        self.certificates: dict[Job, _Certificate | None] = {}
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


class _Certificate:
    """Why a queued job's last scoring still holds (see the module docstring)."""

    __slots__ = ("job", "view", "waits_for", "ahead", "expires", "threshold", "clean", "owner")

    def __init__(self, owner: MemoScheduler, job: Job, view: LoadOrder, waits_for: str, ahead: float | None,
                 expires: float, threshold: float | None) -> None:
        self.owner = owner
        self.job = job
        self.view = view
        self.waits_for = waits_for
        self.ahead = ahead
        """Queued cost ahead of it for ``waits_for`` when scored (None: the answer does not use it)."""
        self.expires = expires
        """The earliest time a time test it went through can flip (a little early, to be safe)."""
        self.threshold = threshold
        """Rule 5: in-flight FLOPs below which a worker without a match may beat waiting (else None)."""
        self.clean = True

    def dirty(self) -> None:
        if self.clean:
            self.clean = False
            self.owner._dirty.add(self.job)
            self.owner._just_dirtied.append(self.job)


class _QueueLog(deque):
    """The scheduler's queue; a job appended into the scan window is new to the memo."""

    def __init__(self, on_append: Callable[[Job], None]) -> None:
        super().__init__()
        self._on_append = on_append

    def append(self, job: Job) -> None:
        super().append(job)
        if len(self) <= PUMP_SCAN_LIMIT:
            self._on_append(job)


class _AheadBefore:
    """``pump``'s running sums of queued waiting costs, computed on demand at window position ``k``."""

    def __init__(self, window: list[Job], placed: set[Job]) -> None:
        self.window = window
        self.placed = placed
        self.k = 0

    def get(self, worker_id: str, default: float = 0.0) -> float:
        total, found = 0.0, False
        placed = self.placed
        for job in self.window[:self.k]:
            if job.waiting_for == worker_id and job not in placed:
                total = total + job.waiting_cost if found else 0.0 + job.waiting_cost
                found = True
        return total if found else default


class MemoScheduler(Scheduler):
    """``Scheduler`` that skips scorings a certificate vouches for; ``memo=False`` is the plain router.

    With ``memo``, ``pump`` visits only the jobs of its scan window that are new, whose certificate
    broke, or whose waiting time crossed a limit, in queue order, with the same room test, scan
    window and running sums as ``Scheduler.pump``; every other job would be scored "still waiting".
    It assumes what the simulator guarantees: no job is cancelled, excluded from a worker, or left
    without a routable worker. It uses only the scheduler's published hooks: it overrides ``try_place``,
    ``pump``, ``release`` and ``reserved``, and reads ``view``, ``uniform_view``, ``any_admissible``, ``ahead``.
    """

    def __init__(self, *args, memo: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.memo = memo
        self.skipped = 0
        self.scored = 0
        self.quiet_pumps = 0
        self._dirty: set[Job] = set()
        """Queued jobs to score at the next pump (new, or their certificate broke)."""
        self._just_dirtied: list[Job] = []
        self._expiry: list[tuple[float, int, _Certificate]] = []
        self._on_index: dict[int, list[_Certificate]] = {}
        """Slot -> certificates broken by any change to that target's tables."""
        self._on_load: dict[int, list[_Certificate]] = {}
        """Slot -> certificates broken by any change to that worker's in-flight FLOPs."""
        self._on_full: dict[int, list[_Certificate]] = {}
        """Slot -> certificates broken when that worker reaches Θ."""
        self._on_heavier: dict[int, list[tuple[_Certificate, float]]] = {}
        """Slot -> (certificate, lightest load of the others matching as deep): broken when that worker,
        the certificate's best, gets as heavy (or reaches Θ)."""
        self._on_lighter: dict[int, list[tuple[_Certificate, Worker]]] = {}
        """Slot -> (certificate, its best worker): broken when that worker gets as light as the best."""
        self._pool: list[tuple[float, int, _Certificate]] = []
        """Rule-5 certificates by descending threshold (negated, for the heap)."""
        self._seq = itertools.count()
        self._pumped_view: LoadOrder | None = None
        self._watched: dict[Job, int] = {}
        """Queued job -> how many of its leading blocks are in the index's watch lists."""
        if memo:
            self.queue = _QueueLog(self._dirty.add)
        index = self.index
        if not isinstance(index, LoggedBlockIndex):
            raise TypeError("MemoScheduler needs a LoggedBlockIndex")
        index.on_touch = lambda slot: _break(self._on_index, slot)
        self._certs = index.certificates

    # -- what can break a certificate -----------------------------------------------------------
    def reserved(self, placement: Placement) -> None:
        w = placement.worker
        full = not w.admissible
        load = w.inflight_flops
        for slot in w.slots.values():
            _break(self._on_load, slot)
            if full:
                _break(self._on_full, slot)
            watching = self._on_heavier.get(slot)
            if watching:  # held jobs for which this worker may no longer be the lightest deepest match
                keep = []
                for cert, runner_up in watching:
                    if cert.clean:
                        if full or load >= runner_up:
                            cert.dirty()
                        else:
                            keep.append((cert, runner_up))
                self._on_heavier[slot] = keep

    def release(self, placement: Placement, *, ok: bool) -> None:
        if not placement.released:
            w = placement.worker
            after = w.inflight_flops - placement.cost if w.inflight_requests > 1 else 0.0
            for slot in w.slots.values():
                _break(self._on_load, slot)
                watching = self._on_lighter.get(slot)
                if watching:  # held jobs whose best may now be this worker instead
                    keep = []
                    for c, best in watching:
                        if c.clean:
                            if after <= best.inflight_flops:
                                c.dirty()
                            else:
                                keep.append((c, best))
                    self._on_lighter[slot] = keep
            pool = self._pool
            # Rule 5: jobs for which this worker, now lighter, may be worth spilling to (with slack for
            # rounding: dirtying one too many only costs a scoring).
            while pool and -pool[0][0] > after * (1 - 1e-9) - 1.0:
                heapq.heappop(pool)[2].dirty()
        super().release(placement, ok=ok)

    # -- scoring --------------------------------------------------------------------------------
    def pump(self) -> None:
        if not self.memo:
            return super().pump()
        now = self.clock()
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            heapq.heappop(expiry)[2].dirty()
        view = self.uniform_view(self.pool.routable())
        if view is not self._pumped_view:
            self._pumped_view = view
            self._dirty.update(self.queue)
        if not self._dirty:
            self.quiet_pumps += 1
            return  # every job it would scan would be scored "still waiting"
        queue, dirty = self.queue, self._dirty
        window = list(itertools.islice(queue, PUMP_SCAN_LIMIT))
        position: dict[int, int] | None = None

        def index_of(job: Job) -> int | None:
            nonlocal position
            if position is None:
                position = {id(job): k for k, job in enumerate(window)}
            return position.get(id(job))

        if len(dirty) < 16:
            todo = [k for k in map(index_of, dirty) if k is not None]
        else:
            todo = [k for k, job in enumerate(window) if job in dirty]
        heapq.heapify(todo)
        self._just_dirtied = []
        placed: set[Job] = set()
        ahead = _AheadBefore(window, placed)
        outer, self.ahead = self.ahead, ahead
        room: bool | None = None
        done = -1
        try:
            while todo:
                k = heapq.heappop(todo)
                if k <= done:
                    continue
                done = k
                job = window[k]
                if room is None:
                    room = self.any_admissible()
                if not room:
                    break
                self._dirty.discard(job)
                ahead.k = k
                before = (job.waiting_for, job.waiting_cost)
                placement = self.try_place(job)
                changed: set[str | None] = set()
                if placement is not None:
                    placed.add(job)
                    job.future.set_result(placement)
                    room = None
                    changed.add(before[0])
                elif (job.waiting_for, job.waiting_cost) != before:
                    changed.update((before[0], job.waiting_for))
                changed.discard(None)
                if changed:  # the running sums of the jobs behind it changed: score them too
                    certs = self._certs
                    for j in range(k + 1, len(window)):
                        behind = window[j]
                        if behind.waiting_for in changed and behind not in dirty and _uses_ahead(certs.get(behind)):
                            dirty.add(behind)
                            heapq.heappush(todo, j)
                if self._just_dirtied:  # made dirty by this scoring, further on: this pump's
                    for other in self._just_dirtied:
                        j = index_of(other)
                        if j is not None and j > k:
                            heapq.heappush(todo, j)
                    self._just_dirtied = []
        finally:
            self.ahead = outer
        for job in placed:
            queue.remove(job)
            self._dirty.discard(job)
        if placed:  # jobs behind the window moved into it: never scored yet
            for job in itertools.islice(queue, max(0, PUMP_SCAN_LIMIT - len(placed)), PUMP_SCAN_LIMIT):
                if job not in self._certs:
                    dirty.add(job)

    def try_place(self, job: Job) -> Placement | None:
        c = self._certs.get(job)
        if (c is not None and c.clean and self.ahead is not None and self.clock() < c.expires
                and self.view is c.view and (c.ahead is None or self.ahead.get(c.waits_for, 0.0) == c.ahead)):
            self.skipped += 1
            return None
        self.scored += 1
        placement = super().try_place(job)
        if c is not None:
            c.clean = False  # superseded (not dirty: it was just scored)
        if placement is None:
            self._certs[job] = self._certify(job) if self.memo else None
        else:
            self._certs.pop(job, None)
            self._unwatch(job)
        return placement

    def _watch_blocks(self, job: Job, upto: int) -> None:
        """Break the job's certificates when a table gains or loses any of its first ``upto`` blocks."""
        have = self._watched.get(job, 0)
        if upto > have:
            watch = self.index.watch
            for h in job.keys[0][have:upto]:
                jobs = watch.get(h)
                if jobs is None:
                    watch[h] = {job}
                else:
                    jobs.add(job)
            self._watched[job] = upto

    def _unwatch(self, job: Job) -> None:
        have = self._watched.pop(job, 0)
        if have:
            watch = self.index.watch
            for h in job.keys[0][:have]:
                jobs = watch.get(h)
                if jobs is not None:
                    jobs.discard(job)
                    if not jobs:
                        del watch[h]

    def _certify(self, job: Job) -> _Certificate | None:
        cfg = self.cfg
        if (cfg.policy != "longest_block_match" or job.waiting_for is None or self.ahead is None
                or job.exclude or len(job.keys) != 1 or not job.keys[0] or self.scan_all):
            return None
        view = self.view
        if view is None or not view.uniform or not view.single_slot or not view.any_admissible():
            return None  # (with no room anywhere the scoring stopped before the policy ran)
        keys = job.keys[0]
        groups = self.index.match_groups(keys, view.mask)
        if not groups:
            return None
        waited = self.clock() - job.arrived
        expires = float("inf")
        for limit in (cfg.max_affinity_wait_s, cfg.prefix_wait_s):
            if waited < limit:
                expires = min(expires, job.arrived + limit - 1e-6 * max(1.0, abs(job.arrived + limit)))
        seq = next(self._seq)
        top_blocks, top = groups[0]
        best = view.best_in(top, admissible=False)
        if best is not None and best.admissible and best.id == job.waiting_for:
            # Held on its best worker (the policy reserves the best when it has room; None = held).
            c = _Certificate(self, job, view, job.waiting_for, None, expires, None)
            self._watch_blocks(job, top_blocks + 1)
            best_slot = best.slots[0] if 0 in best.slots else min(best.slots.values())
            if top & (top - 1):  # several workers match deepest: the lightest of them is the best
                runner_up = float("inf")
                m = top & ~(1 << best_slot)
                while m:
                    low = m & -m
                    slot = low.bit_length() - 1
                    runner_up = min(runner_up, view.owner[slot].inflight_flops)
                    self._on_lighter.setdefault(slot, []).append((c, best))
                    m ^= low
                self._on_heavier.setdefault(best_slot, []).append((c, runner_up))
            else:
                self._on_full.setdefault(best_slot, []).append(c)
        else:
            matched = 0
            for _, mask in groups:
                matched |= mask
            owner = view.owner
            room_in_matched = False
            m = matched
            while m:
                low = m & -m
                if owner[low.bit_length() - 1].admissible:
                    room_in_matched = True
                    break
                m ^= low
            ahead = self.ahead.get(job.waiting_for, 0.0)
            threshold = None
            if not room_in_matched:
                waits_for = self.pool.workers[job.waiting_for]
                threshold = waits_for.inflight_flops + ahead + job.waiting_cost - job_cost(waits_for, job, [0])
            c = _Certificate(self, job, view, job.waiting_for, ahead, expires, threshold)
            _watch(self._on_load, matched, c)
            _watch(self._on_index, matched, c)
            self._watch_blocks(job, 1)
            if threshold is not None:
                heapq.heappush(self._pool, (-threshold, seq, c))
        if expires != float("inf"):
            heapq.heappush(self._expiry, (expires, seq, c))
        self._collect()
        return c

    def _collect(self) -> None:
        """Drop certificates that no longer hold from the watch lists once they pile up."""
        if len(self._pool) > COLLECT_AT:
            self._pool = [e for e in self._pool if e[2].clean]
            heapq.heapify(self._pool)
        if len(self._expiry) > COLLECT_AT:
            self._expiry = [e for e in self._expiry if e[2].clean]
            heapq.heapify(self._expiry)


def _watch(lists: dict[int, list[_Certificate]], mask: int, c: _Certificate) -> None:
    while mask:
        low = mask & -mask
        lists.setdefault(low.bit_length() - 1, []).append(c)
        mask ^= low


def _break(lists: dict[int, list[_Certificate]], slot: int) -> None:
    certs = lists.pop(slot, None)
    if certs:
        for c in certs:
            c.dirty()


def _uses_ahead(c: _Certificate | None) -> bool:
    return c is None or c.ahead is not None
