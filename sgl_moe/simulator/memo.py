"""The router's Scheduler, minus re-scoring queued jobs whose answer cannot have changed.

Why: ``Scheduler.pump`` re-scores up to ``PUMP_SCAN_LIMIT`` queued jobs on every release and every
stored-blocks event. When a worker's batch finishes, each of its releases re-scores the same waiting
jobs: ~240 scorings per request in an offline run at 64 workers (the real router pays that CPU too).

A ``longest_block_match`` job that scoring left in the queue gets a certificate that lists what its
answer depends on; events that touch any of it mark the certificate dirty as they happen.

* **Held on its best worker** (the best has room, but the matched blocks are only promised there):
  the answer depends on the job's own blocks in every table (which worker matches deepest, what is
  committed), the loads of the deepest-matching workers if there are several (which one is best),
  the best's load (it holds only while computing the promised blocks again would pass Θ, and while the
  best has room), and the prefix-wait time limit.
* **Waiting** (its best is saturated and spilling does not pay yet), or held elsewhere: on the loads
  and tables of every worker holding a prefix of it (``M``), on no other worker gaining its first
  block, on the queued cost ahead of it for the worker it waits for (checked when it comes up), on
  both time limits (the affinity wait counted from ``Job.wait_started``), and, when no worker of ``M``
  had room, on no worker without a match becoming cheaper than waiting (``inflight + cost <
  wait_finish``, the router's spill test).

* **Deferred** (the first pass of ``Scheduler.pump`` deferred its spill): a first pass leaves such a job
  exactly as a wait does (waiting for its best worker at its cost there); only whether the pass deferred
  a spill (and so makes a second pass) differs. The certificate vouches for the best worker and its cost
  alone: the loads of the deepest-matching workers (all saturated) and the job's first blocks in every
  table. A first pass scores such jobs only until one of them defers again (then the second pass is
  decided); a second pass scores them all (they may spill).

``pump`` then makes the router's two passes, each visiting only the jobs of its scan window that are
new, dirty, or past a time limit (and the deferred ones, as above), in queue order, with the same room
test, window and running sums as ``Scheduler.pump``: every other job would be scored "still waiting" and
change nothing. Everything else
is the router's code; ``tests/simulator`` checks that runs with and without the memo place alike.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

from sgl_moe.router.candidates import job_cost
from sgl_moe.router.job import Job, Placement
from sgl_moe.router.load_order import LoadOrder
from sgl_moe.router.scheduler import PUMP_SCAN_LIMIT, Scheduler, theta_is_measured
from sgl_moe.router.worker import Worker
from sgl_moe.simulator.certificate import Certificate, QueueLog, Waiters, break_slots, uses_ahead, watch_slots
from sgl_moe.simulator.logged_index import LoggedBlockIndex
from sgl_moe.simulator.room import RoomList
from sgl_moe.simulator.spill_rule import spill_penalty

COLLECT_AT = 65536
"""Watch-list size at which certificates that no longer hold are dropped."""
INF = float("inf")


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
        self.new_holds: list[Job] = []
        """Jobs held for promised blocks for the first time since the frontend last took this list (it arms
        the router's hold timer for each)."""
        self.certified: Counter[str] = Counter()
        """Certificates given, by kind (deferred, held, waiting, rule5, other): what tests check was exercised."""
        self._dirty: set[Job] = set()
        """Queued jobs to score at the next pump (new, or their certificate broke)."""
        self._visit: list[tuple[int, Job]] | None = None
        """During a pass: the queue numbers of the jobs still to visit (a heap)."""
        self._at = 0
        """During a pass: the queue number of the job last scored."""
        self._window_end: float = INF
        """During a pass: the queue number of the last job of its scan window."""
        self._expiry: list[tuple[float, int, Certificate]] = []
        self._on_index: dict[int, list[Certificate]] = {}
        """Slot -> certificates broken by any change to that target's tables."""
        self._on_load: dict[int, list[Certificate]] = {}
        """Slot -> certificates broken by any change to that worker's in-flight FLOPs."""
        self._on_release: dict[int, list[Certificate]] = {}
        """Slot -> certificates broken when that worker's in-flight FLOPs drop."""
        self._on_room: dict[int, list[Certificate]] = {}
        """Slot -> certificates broken when that worker (saturated) gets below Θ."""
        self._on_hold_end: dict[int, list[tuple[Certificate, float]]] = {}
        """Slot -> (certificate of a job held there, FLOPs of computing its promised blocks again): broken
        when that worker gets light enough for the duplicate to stay below Θ (the hold ends)."""
        self._on_heavier: dict[int, list[tuple[Certificate, float]]] = {}
        """Slot -> (certificate, lightest load of the others matching as deep): broken when that worker,
        the certificate's best, gets as heavy (or reaches Θ)."""
        self._on_lighter: dict[int, list[tuple[Certificate, Worker]]] = {}
        """Slot -> (certificate, its best worker): broken when that worker gets as light as the best."""
        self._pool: list[tuple[float, int, Certificate]] = []
        """Rule-5 certificates by descending threshold (negated, for the heap)."""
        self._seq = itertools.count()
        self._pumped_view: LoadOrder | None = None
        self._watched: dict[Job, int] = {}
        """Queued job -> how many of its leading blocks are in the index's watch lists."""
        self._deferred: set[Job] = set()
        """Queued jobs whose last scoring deferred their spill and gave them a certificate."""
        if memo:
            self.queue = QueueLog(self._appended)
        self._waiters = Waiters(self.queue.number if memo else {})
        index = self.index
        self._certs: dict[Job, Certificate | None] = {}
        if memo:
            if not isinstance(index, LoggedBlockIndex):
                raise TypeError("MemoScheduler with memo needs a LoggedBlockIndex")
            index.on_touch = lambda slot: break_slots(self._on_index, slot)
            self._certs = index.certificates
        self.room: RoomList | None = None
        """Round robin's candidates (``room``), handed to the policy in place of the whole pool."""
        if self.cfg.policy == "round_robin":
            self.room = RoomList(self.policy, self.pool.routable())
            self.policy.next_round_robin = self.room.next_round_robin
        self._seen_routable: list[Worker] | None = None
        self._seen_view: LoadOrder | None = None
        first = next(iter(self.pool.workers.values()), None)
        self._spill_k = spill_penalty(self.cfg, first.info) if memo and first is not None else None
        """The spill test's penalty (``spill_rule``); None: rule-5 jobs get no certificate."""

    # -- what can break a certificate -----------------------------------------------------------
    def uniform_view(self, workers: list[Worker]) -> LoadOrder | None:
        """``Scheduler.uniform_view`` without comparing every worker each time: the simulator's routable list is
        one list object that never changes (``SimPool.routable``), so the same object means the same view."""
        view = self._seen_view
        if workers is self._seen_routable and view is not None and view is self.view and not view.stale:
            return view if view.uniform else None
        found = super().uniform_view(workers)
        self._seen_routable, self._seen_view = workers, self.view
        return found

    def reserved(self, placement: Placement) -> None:
        w = placement.worker
        if self.room is not None:
            self.room.reserved(w)
        if not self.memo:
            return
        full = not w.admissible
        load = w.inflight_flops
        for slot in w.slots.values():
            break_slots(self._on_load, slot)
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
        if not self.memo:
            if self.room is not None and not placement.released:
                self.room.released(placement.worker)
            return super().release(placement, ok=ok)
        if not placement.released:
            w = placement.worker
            after = w.inflight_flops - placement.cost if w.inflight_requests > 1 else 0.0
            for slot in w.slots.values():
                break_slots(self._on_load, slot)
                break_slots(self._on_release, slot)
                room = self._on_room.get(slot)
                if room:
                    limit = w.theta * (1 + 1e-9) + 1.0
                    if after < limit:
                        break_slots(self._on_room, slot)
                    else:
                        self._on_room[slot] = [c for c in room if c.clean]
                held = self._on_hold_end.get(slot)
                if held:  # jobs held there: the router's test, ``inflight + duplicate <= Θ`` ends the hold
                    limit = w.theta * (1 + 1e-9) + 1.0
                    keep = []
                    for c, dup in held:
                        if c.clean:
                            if after + dup <= limit:
                                c.dirty()
                            else:
                                keep.append((c, dup))
                    self._on_hold_end[slot] = keep
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
        dirty = self._dirty
        if view is not self._pumped_view:
            self._pumped_view = view
            dirty.update(self.queue)
        if not dirty and not self._deferred:
            self.quiet_pumps += 1
            return  # every job it would scan would be scored "still waiting"
        # ``Scheduler.pump``'s two passes: the first with spills deferred; the second, when the first deferred
        # a spill and some worker still has room, lets deferred jobs spill into it.
        policy = self.policy
        policy.defer_spills = True
        try:
            again = self._pass(first=True)
        finally:
            policy.defer_spills = False
        if again:
            self._pass(first=False)

    def _pass(self, *, first: bool) -> bool:
        """One pass over the scan window in queue order, as ``Scheduler.pump`` makes one, visiting only the jobs
        to score (``_visit``, a heap by queue number): the dirty ones, and those whose waiting cost ahead
        changed at a scored job (``_sum_changed``). True when the policy deferred a spill and some worker has
        room (``Scheduler.pump``'s second pass).

        Jobs with a deferred certificate are scored too: by the second pass (they may spill), and by the
        first until one of them defers again (``need_deferred``); after that, whether the others would defer
        or wait changes neither them nor the pass."""
        queue, dirty, certs, number = self.queue, self._dirty, self._certs, self.queue.number
        self._window_end = number[queue[PUMP_SCAN_LIMIT - 1]] if len(queue) >= PUMP_SCAN_LIMIT else INF
        end = self._window_end
        deferred_jobs = self._deferred
        need_deferred = bool(deferred_jobs)
        visit = [(n, job) for job in dirty if (n := number.get(job, INF)) <= end]
        visit += [(number[job], job) for job in deferred_jobs]
        heapq.heapify(visit)
        self._visit, self._at = visit, 0
        placed: list[Job] = []
        waiters = self._waiters
        outer, self.ahead = self.ahead, waiters
        room: bool | None = None
        deferred = False
        try:
            while visit:
                n, job = heapq.heappop(visit)
                if n <= self._at:
                    continue  # listed twice
                if job not in dirty:
                    c = certs.get(job)
                    if not (need_deferred and c is not None and c.deferred and c.clean):
                        continue
                if room is None:
                    room = self.any_admissible()
                if not room:
                    break  # (the jobs left keep their reason to be scored at the next pump)
                self._at = n
                dirty.discard(job)
                before, before_cost = job.waiting_for, job.waiting_cost
                waiters.job = job
                self.last_deferred = False
                placement = self.try_place(job)
                if placement is not None:
                    placed.append(job)
                    job.future.set_result(placement)
                    room = None
                    if before is not None:
                        self._sum_changed(before, n)
                    continue
                if self.last_deferred:  # its spill waits for the second pass (or the next pump)
                    deferred = True
                    if first:
                        need_deferred = False
                    if certs.get(job) is None:
                        self.mark_dirty(job)
                if job.waiting_for != before or job.waiting_cost != before_cost:
                    for w in {before, job.waiting_for}:
                        if w is not None:
                            self._sum_changed(w, n)
        finally:
            self.ahead = outer
            self._visit = None
        for job in placed:
            queue.remove(job)
            queue.forget(job)
            dirty.discard(job)
        if placed:  # jobs behind the window moved into it: never scored yet
            for job in itertools.islice(queue, max(0, PUMP_SCAN_LIMIT - len(placed)), PUMP_SCAN_LIMIT):
                if job not in certs:
                    self.mark_dirty(job)
        return deferred and (room if room is not None else self.any_admissible())

    def _sum_changed(self, worker_id: str, n: int) -> None:
        """The waiting cost ahead for ``worker_id`` changed at queue number ``n``: the jobs behind that wait for
        it and whose answer used that sum are scored too."""
        certs = self._certs
        for job in self._waiters.behind(worker_id, n):
            if uses_ahead(certs.get(job)):
                self.mark_dirty(job)

    def mark_dirty(self, job: Job) -> None:
        """Score ``job`` at the next pump (new, or its certificate broke); during a pass, in it if it is behind."""
        self._dirty.add(job)
        visit = self._visit
        if visit is not None:
            n = self.queue.number.get(job)
            if n is not None and self._at < n <= self._window_end:
                heapq.heappush(visit, (n, job))

    def _appended(self, job: Job, in_window: bool) -> None:
        """A job joined the queue (``QueueLog``): new to the memo in the scan window; its wait, if it was
        scored before it queued, counts for the jobs behind."""
        if in_window:
            self.mark_dirty(job)
        if job.waiting_for is not None:
            self._waiters.moved(job, None)

    def try_place(self, job: Job) -> Placement | None:
        if not self.memo and self.cfg.policy != "longest_block_match":
            return super().try_place(job)  # nothing to note: no certificates, and only this policy holds jobs
        c = self._certs.get(job)
        if (c is not None and c.clean and not c.deferred and self.ahead is not None and self.clock() < c.expires
                and self.view is c.view and (c.ahead is None or self.ahead.get(c.waits_for, 0.0) == c.ahead)):
            self.skipped += 1
            return None
        self.scored += 1
        before, was_held = job.waiting_for, job.held
        placement = super().try_place(job)
        if job.held and not was_held:
            self.new_holds.append(job)
        if c is not None:
            c.clean = False  # superseded (not dirty: it was just scored)
        if self.memo:
            if placement is None:
                self._waiters.moved(job, before)
            else:
                self._waiters.left(job, before)
        if placement is None:
            cert = self._certs[job] = self._certify(job, self.last_deferred) if self.memo else None
            if cert is not None:
                self.certified[cert.kind] += 1
            if cert is not None and cert.deferred:
                self._deferred.add(job)
            else:
                self._deferred.discard(job)
        else:
            self._certs.pop(job, None)
            self._deferred.discard(job)
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

    def _certify(self, job: Job, deferred: bool) -> Certificate | None:
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
        now = self.clock()
        expires = float("inf")
        # The prefix wait counts from arrival; the affinity wait from when the job first chose to wait.
        # (The router may fix the affinity limit per job when the wait starts: ``Job.wait_limit_s``.)
        wait_limit = getattr(job, "wait_limit_s", None)
        if wait_limit is None:
            wait_limit = cfg.max_affinity_wait_s
        for start, limit in ((job.wait_started, wait_limit), (job.arrived, cfg.prefix_wait_s)):
            if start is not None and now - start < limit:
                expires = min(expires, start + limit - 1e-6 * max(1.0, abs(start + limit)))
        seq = next(self._seq)
        top_blocks, top = groups[0]
        best = view.best_in(top, admissible=False)
        if deferred:
            if best is None or best.admissible or best.id != job.waiting_for:
                return None
            # The best stays the best, at the same cost, while the deepest-matching workers (all saturated:
            # the best is the lightest of them) keep their loads and no table gains or loses one of the first
            # ``top_blocks + 1`` blocks; the time limits only make a spill more due.
            c = Certificate(self, job, view, job.waiting_for, None, INF, None, deferred=True)
            self._watch_blocks(job, top_blocks + 1)
            self._watch_best(c, top, best)
            self._collect()
            return c
        if best is not None and best.admissible and best.id == job.waiting_for:
            # Held on its best worker (the policy reserves the best when it has room; None = held).
            c = Certificate(self, job, view, job.waiting_for, None, expires, None)
            self._watch_blocks(job, top_blocks + 1)
            best_slot = best.slots[0] if 0 in best.slots else min(best.slots.values())
            runner_up = INF
            if top & (top - 1):  # several workers match deepest: the lightest of them is the best
                m = top & ~(1 << best_slot)
                while m:
                    low = m & -m
                    slot = low.bit_length() - 1
                    runner_up = min(runner_up, view.owner[slot].inflight_flops)
                    self._on_lighter.setdefault(slot, []).append((c, best))
                    m ^= low
            # Held only while recomputing the promised blocks there would pass Θ (a measured Θ; otherwise
            # always): a lighter best may end the hold; a heavier one keeps it until it reaches Θ (or the
            # lightest other deepest match).
            self._on_heavier.setdefault(best_slot, []).append((c, runner_up))
            if len(job.prompt_lens) == 1 and theta_is_measured(best):
                page, n = best.page_size, job.prompt_lens[0]
                committed = self.index.committed_prefix(best_slot, keys[:top_blocks])
                dup = job_cost(best, job, [min(committed * page, ((n - 1) // page) * page)])
                self._on_hold_end.setdefault(best_slot, []).append((c, dup))
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
                if self._spill_k is None:
                    return None
                waits_for = self.pool.workers[job.waiting_for]
                free = job_cost(waits_for, job, [0])
                threshold = (waits_for.inflight_flops + ahead + job.waiting_cost - free
                             - self._spill_k * max(0.0, free - job.waiting_cost))
            c = Certificate(self, job, view, job.waiting_for, ahead, expires, threshold)
            if best is not None and best.id == job.waiting_for and not best.admissible:
                self._watch_waiting(c, groups, view, best, room_in_matched)
            else:  # held on the worker it would spill to: every matched worker's load and tables
                watch_slots(self._on_load, matched, c)
                watch_slots(self._on_index, matched, c)
                self._watch_blocks(job, 1)
            if threshold is not None:
                heapq.heappush(self._pool, (-threshold, seq, c))
        if expires != float("inf"):
            heapq.heappush(self._expiry, (expires, seq, c))
        self._collect()
        return c

    def _watch_best(self, c: Certificate, top: int, best: Worker) -> None:
        """The saturated ``best`` stays the best (at the same cost) until it gets below Θ or another of the
        deepest-matching workers (``top``, all saturated) gets as light as it: none can get heavier."""
        best_slot = best.slots[0] if 0 in best.slots else min(best.slots.values())
        m = top
        while m:
            low = m & -m
            slot = low.bit_length() - 1
            if slot == best_slot:
                self._on_room.setdefault(slot, []).append(c)
            else:
                self._on_lighter.setdefault(slot, []).append((c, best))
            m ^= low

    def _watch_waiting(self, c: Certificate, groups: list[tuple[int, int]], view: LoadOrder, best: Worker,
                       room_in_matched: bool) -> None:
        """What a job waiting for its saturated best depends on, besides the queued cost ahead and time.

        Every worker's match moves only when a table gains or loses one of the job's first ``top + 1``
        blocks (watched). The best, and its cost, stay while the deepest-matching workers (all saturated)
        keep their loads. The spill target is the deepest-matching worker with room, the lightest of its
        group; the spill's finish only grows with its load, so the answer stands until that worker reaches
        Θ, or a worker matching as deep or deeper gets lighter (it may take its place). With no room among
        the matched workers the spill target is the lightest worker without a match: rule 5 (``threshold``)
        and any matched worker getting below Θ. (A lighter best only makes waiting pay more.)"""
        top_blocks, top = groups[0]
        self._watch_blocks(c.job, top_blocks + 1)
        self._watch_best(c, top, best)
        deeper = 0
        for _, mask in groups[1:]:
            if room_in_matched:
                alt = view.best_in(mask, admissible=True)
                if alt is not None:  # the spill target: a lighter one spills sooner; at Θ another takes its place
                    slot = alt.slots[0] if 0 in alt.slots else min(alt.slots.values())
                    self._on_heavier.setdefault(slot, []).append((c, INF))
                    self._on_release.setdefault(slot, []).append(c)
                    deeper |= mask & ~(1 << slot)
                    break
            deeper |= mask
        watch_slots(self._on_room, deeper, c)

    def _collect(self) -> None:
        """Drop certificates that no longer hold from the watch lists once they pile up."""
        if len(self._pool) > COLLECT_AT:
            self._pool = [e for e in self._pool if e[2].clean]
            heapq.heapify(self._pool)
        if len(self._expiry) > COLLECT_AT:
            self._expiry = [e for e in self._expiry if e[2].clean]
            heapq.heapify(self._expiry)
