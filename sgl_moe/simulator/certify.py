"""What a queued ``longest_block_match`` job's "still waiting" answer depends on: its certificate.

After a scoring leaves a job in the queue, ``Certifier.issue`` lists what the answer depends on in the
``WatchLists`` (events there break the certificate) and the index's block watch (a table gaining or
losing one of the job's leading blocks breaks it):

* **Held on its best worker** (the best has room, but the matched blocks are only promised there):
  the answer depends on the job's own blocks in every table (which worker matches deepest, what is
  committed), the loads of the deepest-matching workers if there are several (which one is best),
  the best's load (it holds only while computing the promised blocks again would pass Θ, and while the
  best has room: ``Certificate.needs_room``), and the prefix-wait time limit.
* **Waiting** (its best is saturated and spilling does not pay yet), or held elsewhere: on the loads
  and tables of every worker holding a prefix of it (``M``), on no other worker gaining its first
  block, on the queued cost ahead of it for the worker it waits for (checked when it comes up), on
  both time limits (the affinity wait counted from ``Job.wait_started``), and, when no worker of ``M``
  had room, on no worker without a match becoming cheaper than waiting (``inflight + cost <
  wait_finish``, the router's spill test: rule 5, ``spill_rule``).
* **Deferred** (the first pass of ``Scheduler.pump`` deferred its spill): a first pass leaves such a job
  exactly as a wait does (waiting for its best worker at its cost there); only whether the pass deferred
  a spill (and so makes a second pass) differs. The certificate vouches for the best worker and its cost
  alone: the loads of the deepest-matching workers (all saturated) and the job's first blocks in every
  table. A first pass scores such jobs only until one of them defers again (then the second pass is
  decided); a second pass scores them all (they may spill).
"""

from __future__ import annotations

from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.candidates import job_cost
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.load_order import LoadOrder
from sgl_moe.router.placement.scheduler import Scheduler, theta_is_measured
from sgl_moe.simulator.certificate import Certificate, DirtySink
from sgl_moe.simulator.logged_index import LoggedBlockIndex
from sgl_moe.simulator.spill_rule import spill_penalty
from sgl_moe.simulator.watch_lists import WatchLists

INF = float("inf")


def first_slot(w: Worker) -> int:
    return w.slots[0] if 0 in w.slots else min(w.slots.values())


class Certifier:
    """Issues certificates for one scheduler's queued jobs, right after their scoring."""

    def __init__(self, scheduler: Scheduler, sink: DirtySink, index: LoggedBlockIndex, watches: WatchLists) -> None:
        self.scheduler = scheduler
        self.sink = sink
        self.index = index
        self.watches = watches
        first = next(iter(scheduler.pool.workers.values()), None)
        self.spill_k = spill_penalty(scheduler.cfg, first.info) if first is not None else None
        """The spill test's penalty (``spill_rule``); None: rule-5 jobs get no certificate."""

    def issue(self, job: Job, deferred: bool) -> Certificate | None:
        """The certificate of ``job``'s answer just scored (``deferred``: its spill was deferred), or None."""
        sched = self.scheduler
        cfg = sched.cfg
        ahead_costs = sched.ahead
        if (cfg.policy != "longest_block_match" or job.waiting_for is None or ahead_costs is None
                or job.exclude or len(job.keys) != 1 or not job.keys[0] or sched.scan_all):
            return None
        view = sched.view
        if view is None or not view.uniform or not view.single_slot or not view.any_admissible():
            return None  # (with no room anywhere the scoring stopped before the policy ran)
        keys = job.keys[0]
        index = self.index
        groups = index.match_groups(keys, view.mask)
        if not groups:
            return None
        watches = self.watches
        top_blocks, top = groups[0]
        best = view.best_in(top, admissible=False)
        if deferred:
            if best is None or best.admissible or best.id != job.waiting_for:
                return None
            # The best stays the best, at the same cost, while the deepest-matching workers (all saturated:
            # the best is the lightest of them) keep their loads and no table gains or loses one of the first
            # ``top_blocks + 1`` blocks; the time limits only make a spill more due.
            c = Certificate(self.sink, job, view, job.waiting_for, None, INF, None, deferred=True)
            index.watch_job(job, top_blocks + 1)
            self._watch_best(c, view, top, best)
            return c
        expires = self._expires(job)
        if best is not None and best.admissible and best.id == job.waiting_for:
            # Held on its best worker (the policy reserves the best when it has room; None = held).
            c = Certificate(self.sink, job, view, job.waiting_for, None, expires, None)
            c.needs_room = best
            index.watch_job(job, top_blocks + 1)
            best_slot = first_slot(best)
            others = []
            m = top & ~(1 << best_slot)
            while m:  # several workers match deepest: the lightest of them is the best
                low = m & -m
                slot = low.bit_length() - 1
                others.append(view.owner[slot])
                watches.add(watches.on_lighter, slot, (c, best))
                m ^= low
            # Held only while recomputing the promised blocks there would pass Θ (a measured Θ; otherwise
            # always): a lighter best may end the hold; a heavier one keeps it while it has room and stays
            # lighter than the others matching as deep.
            watches.add(watches.on_heavier, best_slot, (c, tuple(others)))
            if len(job.prompt_lens) == 1 and theta_is_measured(best):
                page, n = best.page_size, job.prompt_lens[0]
                committed = index.committed_prefix(best_slot, keys[:top_blocks])
                dup = job_cost(best, job, [min(committed * page, ((n - 1) // page) * page)])
                watches.add(watches.on_hold_end, best_slot, (c, dup))
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
            ahead = ahead_costs.get(job.waiting_for, 0.0)
            threshold = None
            if not room_in_matched:
                if self.spill_k is None:
                    return None
                waits_for = sched.pool.workers[job.waiting_for]
                free = job_cost(waits_for, job, [0])
                threshold = (waits_for.inflight_flops + ahead + job.waiting_cost - free
                             - self.spill_k * max(0.0, free - job.waiting_cost))
            c = Certificate(self.sink, job, view, job.waiting_for, ahead, expires, threshold)
            c.matched = matched
            if best is not None and best.id == job.waiting_for and not best.admissible:
                self._watch_waiting(c, groups, view, best, room_in_matched)
            else:  # held on the worker it would spill to: every matched worker's load and tables
                watches.add_mask(watches.on_load, matched, c)
                watches.add_mask(watches.on_index, matched, c)
                index.watch_job(job, 1)
            if threshold is not None:
                watches.add_rule5(c, threshold)
        if expires != INF:
            watches.add_expiry(c, expires)
        watches.collect()
        return c

    def spill_still_waits(self, c: Certificate) -> bool:
        """Whether ``c``'s job, waiting under rule 5 with a spill possibly due (``Certificate.spill_due``), would
        still wait: no worker without a match (the spill target: none with one has room, or ``c`` would have
        broken) is below the threshold, with slack for rounding. The threshold was taken when the job waited;
        its best worker can only have got lighter since (the threshold only dropped) and the queued cost ahead
        is checked by the scoring's skip test. Then ``c`` is re-armed (back in the rule-5 heap)."""
        view = self.scheduler.view
        if view is not c.view or c.threshold is None:
            return False
        theta = view.theta
        alt = view.least(lambda x: x / theta, highest_id=True, skip=c.matched)
        threshold = c.threshold
        if alt is not None and alt.inflight_flops <= threshold + abs(threshold) * 1e-9 + 1.0:
            return False
        c.spill_due = False
        self.watches.add_rule5(c, threshold)
        return True

    def _expires(self, job: Job) -> float:
        """A little before the earliest time limit the answer went through can flip."""
        cfg = self.scheduler.cfg
        now = self.scheduler.clock()
        expires = INF
        # The prefix wait counts from arrival; the affinity wait from when the job first chose to wait.
        # (The router may fix the affinity limit per job when the wait starts: ``Job.wait_limit_s``.)
        wait_limit = getattr(job, "wait_limit_s", None)
        if wait_limit is None:
            wait_limit = cfg.max_affinity_wait_s
        for start, limit in ((job.wait_started, wait_limit), (job.arrived, cfg.prefix_wait_s)):
            if start is not None and now - start < limit:
                expires = min(expires, start + limit - 1e-6 * max(1.0, abs(start + limit)))
        return expires

    def _watch_best(self, c: Certificate, view: LoadOrder, top: int, best: Worker) -> None:
        """The saturated ``best`` stays the best (at the same cost) until it gets below Θ or another of the
        deepest-matching workers (``top``, all saturated) gets as light as it: none can get heavier."""
        watches = self.watches
        best_slot = first_slot(best)
        on_room, on_lighter = watches.on_room, watches.on_lighter
        m = top
        while m:
            low = m & -m
            slot = low.bit_length() - 1
            if slot == best_slot:
                on_room.setdefault(slot, []).append(c)
            else:
                on_lighter.setdefault(slot, []).append((c, best))
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
        watches = self.watches
        top_blocks, top = groups[0]
        self.index.watch_job(c.job, top_blocks + 1)
        self._watch_best(c, view, top, best)
        deeper = 0
        for _, mask in groups[1:]:
            if room_in_matched:
                alt = view.best_in(mask, admissible=True)
                if alt is not None:  # the spill target: a lighter one spills sooner; at Θ another takes its place
                    slot = first_slot(alt)
                    watches.add(watches.on_heavier, slot, (c, ()))
                    watches.add(watches.on_release, slot, c)
                    deeper |= mask & ~(1 << slot)
                    break
            deeper |= mask
        watches.add_mask(watches.on_room, deeper, c)
