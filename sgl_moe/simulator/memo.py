"""The router's Scheduler, minus re-scoring queued jobs whose answer cannot have changed.

Why: ``Scheduler.pump`` re-scores up to ``PUMP_SCAN_LIMIT`` queued jobs on every release and every
stored-blocks event. When a worker's batch finishes, each of its releases re-scores the same waiting
jobs: ~240 scorings per request in an offline run at 64 workers (the real router pays that CPU too).

A ``longest_block_match`` job that scoring left in the queue gets a certificate (``certify``) that lists
what its answer depends on; events that touch any of it (``watch_lists``) mark the certificate dirty as
they happen.

``pump`` then makes the router's two passes, each visiting only the jobs of its scan window that are
new, dirty, or past a time limit (and those whose spill was deferred: ``certify``), in queue order, with
the same room test, window and running sums as ``Scheduler.pump``: every other job would be scored
"still waiting" and change nothing. Everything else is the router's code; ``tests/simulator`` checks that
runs with and without the memo place alike.
"""

from __future__ import annotations

import heapq
from collections import Counter
from operator import itemgetter

from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.job import Job, Placement
from sgl_moe.router.placement.load_order import LoadOrder
from sgl_moe.router.placement.scheduler import PUMP_SCAN_LIMIT, Scheduler
from sgl_moe.simulator.certificate import Certificate, QueueLog, Waiters
from sgl_moe.simulator.certify import Certifier
from sgl_moe.simulator.logged_index import LoggedBlockIndex
from sgl_moe.simulator.room import RoomList
from sgl_moe.simulator.watch_lists import WatchLists

__all__ = ["LoggedBlockIndex", "MemoScheduler"]

INF = float("inf")
_first = itemgetter(0)


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
        self.full_pumps = 0
        """Pumps with jobs to score while no worker had room."""
        self.held_again = 0
        """Visits of a held job whose worker had been saturated, skipped because it has room again."""
        self.held_dropped = 0
        """Visits of held jobs dropped: their worker, saturated when they were put among those to visit, had room
        again before a pass reached them (``mark_held_revisit``)."""
        self.spill_passed = 0
        """Visits of a rule-5 job with a spill possibly due, left to a later pass: this first pass already deferred
        a spill."""
        self.spill_rechecked = 0
        """Visits of a rule-5 job with a spill possibly due, re-armed: no worker without a match is below the
        threshold."""
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
        self.watches = WatchLists()
        self._pumped_view: LoadOrder | None = None
        self._held_revisits: dict[str, list[Job]] = {}
        """Worker id -> held jobs put among those to visit because that worker got saturated
        (``mark_held_revisit``)."""
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
            index.on_touch = self.watches.touched
            self._certs = index.certificates
        self._certifier = Certifier(self, self, index, self.watches) if memo else None
        self.room: RoomList | None = None
        """Round robin's candidates (``room``), handed to the policy in place of the whole pool."""
        if self.cfg.policy == "round_robin":
            self.room = RoomList(self.policy, self.pool.routable())
            self.policy.next_round_robin = self.room.next_round_robin
        self._seen_routable: list[Worker] | None = None
        self._seen_view: LoadOrder | None = None

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

    def any_admissible(self) -> bool:
        """``Scheduler.any_admissible`` through the view ``uniform_view`` last found (the same test, without building
        the routable list's view again)."""
        view = self._seen_view
        if (view is not None and not self.scan_all and view.uniform and self.pool.routable() is self._seen_routable
                and view is self.view and not view.stale):
            return view.any_admissible()
        return super().any_admissible()

    def reserved(self, placement: Placement) -> None:
        w = placement.worker
        if self.room is not None:
            self.room.reserved(w)
        if self.memo:
            self.watches.reserved(w)

    def release(self, placement: Placement, *, ok: bool) -> None:
        if not placement.released:
            w = placement.worker
            # What ``Scheduler.release`` leaves: exactly zero once idle.
            after = w.inflight_flops - placement.cost if w.inflight_requests > 1 else 0.0
            if self.room is not None:
                self.room.released(w, after)
            if self.memo:
                self.watches.released(w, after)
                if after < w.theta and self._held_revisits:
                    revisits = self._held_revisits.pop(w.id, None)
                    if revisits:
                        self._drop_held_revisits(revisits, w)
        super().release(placement, ok=ok)

    def mark_held_revisit(self, job: Job, worker: Worker) -> None:
        """A held job's worker (``Certificate.needs_room``) got saturated: visit the job (``mark_dirty``), and
        remember why, so that a release giving that worker room before a pass reaches the job drops the visit."""
        self.mark_dirty(job)
        self._held_revisits.setdefault(worker.id, []).append(job)

    def _drop_held_revisits(self, jobs: list[Job], w: Worker) -> None:
        """``w`` has room again (a release, outside any pass): its held jobs that are to be visited only because
        it was saturated would be skipped by ``try_place`` (held again); they are not visited. Another reason to
        visit (a broken certificate, an expiry, a new view) puts them back: ``dirty`` is checked here, expiries
        fire at the pump's start (the clock has not moved), a new view re-marks the whole queue, and a new
        saturation of ``w`` revisits them again."""
        dirty, certs, view = self._dirty, self._certs, self.view
        for job in jobs:
            c = certs.get(job)
            if c is not None and c.clean and c.needs_room is w and not c.spill_due and not c.deferred \
                    and c.view is view and c.ahead is None and job in dirty:
                dirty.discard(job)
                self.held_dropped += 1

    # -- scoring --------------------------------------------------------------------------------
    def pump(self) -> None:
        if not self.memo:
            return super().pump()
        self.watches.expire(self.clock())
        view = self.uniform_view(self.pool.routable())
        dirty = self._dirty
        if view is not self._pumped_view:
            self._pumped_view = view
            dirty.update(self.queue)
        if not dirty and not self._deferred:
            self.quiet_pumps += 1
            return  # every job it would scan would be scored "still waiting"
        if not self.any_admissible():
            self.full_pumps += 1
            return  # ``Scheduler.pump`` stops at its first job (the jobs to score stay so)
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
        get_number = number.get
        visit = [(n, job) for job in dirty if (n := get_number(job, INF)) <= end]
        heapq.heapify(visit)
        # The jobs with a deferred certificate, in queue order, merged with the heap as the pass goes. Once
        # ``need_deferred`` is off, those not dirty would be skipped, and the dirty ones are in the heap too.
        by_number = sorted([(number[job], job) for job in deferred_jobs], key=_first) if need_deferred else []
        n_deferred = len(by_number)
        next_deferred = 0
        self._visit, self._at = visit, 0
        placed: list[Job] = []
        waiters = self._waiters
        outer, self.ahead = self.ahead, waiters
        room: bool | None = None
        deferred = False
        heappop = heapq.heappop
        try:
            while True:
                if need_deferred and next_deferred < n_deferred:
                    entry = by_number[next_deferred]
                    if visit and visit[0][0] <= entry[0]:
                        n, job = heappop(visit)
                    else:
                        n, job = entry
                        next_deferred += 1
                elif visit:
                    n, job = heappop(visit)
                else:
                    break
                if n <= self._at:
                    continue  # listed twice
                c = certs.get(job)
                if job not in dirty:
                    if not (need_deferred and c is not None and c.deferred and c.clean):
                        continue
                elif c is not None and c.spill_due and c.clean and c.view is self.view:
                    if first and deferred:
                        # Wait, or a deferred spill: either leaves the job as it is (waiting for its best at its
                        # cost there), and this pass already deferred a spill. It stays to visit (second pass).
                        self.spill_passed += 1
                        continue
                    if self._certifier.spill_still_waits(c):
                        self.spill_rechecked += 1
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
        if placed:  # jobs behind the window moved into it: never scored yet
            queue.drop_all(placed)
            dirty.difference_update(placed)
            for i in range(max(0, PUMP_SCAN_LIMIT - len(placed)), min(PUMP_SCAN_LIMIT, len(queue))):
                job = queue[i]
                if job not in certs:
                    self.mark_dirty(job)
        return deferred and (room if room is not None else self.any_admissible())

    def _sum_changed(self, worker_id: str, n: int) -> None:
        """The waiting cost ahead for ``worker_id`` changed at queue number ``n``: the jobs behind that wait for
        it and whose answer used that sum are scored too."""
        get = self._certs.get
        for job in self._waiters.behind(worker_id, n):
            c = get(job)
            if c is None or c.ahead is not None:  # (``uses_ahead``)
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
        if (c is not None and c.holds() and not c.deferred and self.ahead is not None and self.clock() < c.expires
                and self.view is c.view and (c.ahead is None or self.ahead.get(c.waits_for, 0.0) == c.ahead)):
            self.skipped += 1
            if c.needs_room is not None:
                self.held_again += 1
            return None
        self.scored += 1
        before, was_held = job.waiting_for, job.held
        if self.memo:
            index = self.index
            index.defer_puts = True
            try:
                placement = super().try_place(job)
            finally:
                index.defer_puts = False
        else:
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
            if self.memo:
                self.index.keep_last_match()  # (scored again later: its match is worth remembering)
            cert = self._certs[job] = self._certifier.issue(job, self.last_deferred) if self._certifier else None
            if cert is not None:
                self.certified[cert.kind] += 1
            if cert is not None and cert.deferred:
                self._deferred.add(job)
            else:
                self._deferred.discard(job)
        else:
            self._certs.pop(job, None)
            self._deferred.discard(job)
            if self.memo:
                self.index.unwatch_job(job)
        return placement
