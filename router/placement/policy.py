"""The policy's pick among scored candidates: ``round_robin``, ``least_flops`` or ``longest_block_match``.

``longest_block_match`` takes the worker holding the longest prefix when it has room. When that worker is
saturated, the job either waits for it or spills to the best worker with room:

- it spills when recomputing the prefix there finishes sooner than the work queued ahead on the best
  worker (equal-speed workers) *by more than the recomputation itself*: the extra FLOPs a spill adds are
  paid once by this request's finish and once more by the work that queues behind it on that worker, so
  a spill that merely finishes a little sooner (a long shared prefix, its holder busy with the request
  computing it) would cost throughput;
- or when it has waited longer than its wait limit *since its wait started* (``Job.wait_started``: the
  first time it chose to wait, not its arrival; in a deep backlog every job would otherwise be "late" the
  moment it comes up, and reuse would collapse). The limit is fixed when the wait starts: twice the time
  the work ahead of it should take at the worker's speed (observed: FLOPs completed per busy second; before
  a few requests ended there, its start-up profile's best), between ``max_affinity_wait_s`` and
  ``MAX_WAIT_LIMIT_S`` (a worker with neither speed: ``max_affinity_wait_s``). A fixed number of seconds
  would be minutes of work on a GPU and a fraction of one long request on a CPU;
- in a backlog, by throughput: while the scheduler's pump makes its first pass over the queue
  (``defer_spills``), a spill is deferred, so capacity goes first to queued jobs that run without
  recomputing anything; only room left over after that pass takes spills (it would idle otherwise).

A job matching nothing anywhere goes to the least-loaded worker after this request; equally loaded
workers (all idle, typically) are taken in turn, so new prefixes spread instead of piling on the lowest id.
With ``prefix_homes`` it goes first to the worker its prefix was last placed on, when that has room; when
that is saturated, its placement by load is deferred to the pump's second pass, as a spill is.

A job without block keys (``Job.affinity`` False: the router could not compute the exact prompt ids, or the
request's KV namespace is not hashed) is placed by load alone under ``longest_block_match`` and
``least_flops``: the least in-flight FLOPs relative to Θ among admissible workers, ties taken in turn
(``by_load``).

A decision is ``(candidate, reason)``; ``(None, reason)`` when the job waits for a saturated worker
(``job.waiting_for``), and None when no candidate has room.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.candidates import Candidate
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.prefix_homes import PrefixHomes

log = logging.getLogger("sgl_moe.router.decisions")

Decision = tuple[Candidate | None, str]

SPILL = "spill"
"""The reason's start when the job goes to a worker other than its best-matching (saturated) one; the
scheduler counts a spill when it reserves such a placement (a spill decision held on its target is not
one)."""

DEFERRED = "spill deferred"
"""The reason's start when a spill waits for the pump's second pass."""

MAX_WAIT_LIMIT_S = 60.0
"""The longest a job waits for its saturated best worker by time alone, whatever the speed estimate says."""

WAITING = "waiting for its saturated best worker"
"""The reason a job keeps waiting when debug logs are off (they get the figures behind it)."""

BY_LOAD = "no affinity: least in-flight FLOPs / Θ, ties in turn"
"""The reason logged for a job placed by load alone."""


class PlacementPolicy:
    """The configured policy, with the round-robin turn both placement paths share."""

    def __init__(self, cfg: RouterConfig, clock: Callable[[], float], stats,
                 queued_cost_before: Callable[[Job, Worker], float]) -> None:
        self.cfg = cfg
        self.clock = clock
        self.stats = stats
        """The scheduler's ``SchedulerStats``."""
        self.queued_cost_before = queued_cost_before
        """FLOPs of the queued jobs ahead of a job that also wait for a worker (the scheduler's queue)."""
        self._rr = itertools.count()
        self.last_by_load: str | None = None
        """Id of the worker the last job placed by load alone (or matching nothing) went to: equally loaded
        workers are taken in turn after it (shared by both placement paths, as the round-robin turn is)."""
        self.defer_spills = False
        """Set by the scheduler during the first pass of a pump: spills wait for the second pass."""
        self.homes = PrefixHomes() if cfg.prefix_homes and cfg.policy == "longest_block_match" else None
        """Where each prefix was last placed (``RouterConfig.prefix_homes``); the scheduler records placements."""

    def choose(self, job: Job, cands: list[Candidate]) -> Decision | None:
        """The policy's pick among scored candidates (both placement paths end here unless they pick alone)."""
        admissible = [c for c in cands if c.worker.admissible]
        if not admissible:
            return None
        policy = self.cfg.policy
        job.waiting_for = None
        if policy == "round_robin":
            choice = admissible[next(self._rr) % len(admissible)]
            reason = "round robin"
        elif not job.affinity:
            choice, reason = self.by_load(admissible)
        elif policy == "least_flops":
            choice = min(admissible, key=lambda c: (c.load, c.worker.id))
            reason = "least in-flight FLOPs / Θ"
        else:
            choice, reason = self.longest_block_match(job, cands, admissible)
            if choice is None:
                return None, reason
        if log.isEnabledFor(logging.DEBUG):
            reason += "; matched blocks per candidate: " + ", ".join(
                f"{c.worker.id}={c.matched_blocks}{'' if c.worker.admissible else ' (saturated)'}" for c in cands)
        return choice, reason

    def by_load(self, admissible: list[Candidate]) -> Decision:
        """The least in-flight FLOPs / Θ; among equal loads, the first worker id after the last one taken
        this way (wrapping), so equally loaded workers take turns."""
        least = min(c.load for c in admissible)
        choice = self.in_turn([c for c in admissible if c.load == least])
        return choice, BY_LOAD

    def in_turn(self, tied: list[Candidate]) -> Candidate:
        """Among tied candidates, the first worker id after the last one taken by load (wrapping); noted."""
        tied = sorted(tied, key=lambda c: c.worker.id)
        after = self.last_by_load
        choice = next((c for c in tied if after is None or c.worker.id > after), tied[0])
        self.took_by_load(choice.worker)
        return choice

    def took_by_load(self, worker: Worker) -> None:
        """``worker`` took a job placed by load alone (the fast path picks it itself, then calls this)."""
        self.last_by_load = worker.id

    def next_round_robin(self, job: Job, workers: list[Worker]) -> Worker | None:
        """The next admissible worker in turn (None: all saturated, the job keeps waiting)."""
        room = [w for w in workers if w.admissible]
        if not room:
            return None
        job.waiting_for = None
        return room[next(self._rr) % len(room)]

    def longest_block_match(self, job: Job, cands: list[Candidate], admissible: list[Candidate]) -> Decision:
        def rank(c: Candidate) -> tuple:
            return (c.matched_blocks, -c.load, c.worker.id)

        best = max(cands, key=rank)
        if best.matched_blocks == 0:
            home_id = self.home_of(job)
            home = next((c for c in cands if c.worker.id == home_id), None) if home_id is not None else None
            decision = self.to_home(job, home) if home is not None else None
            if decision is not None:
                return decision

            def after(c: Candidate) -> float:
                return (c.worker.inflight_flops + c.cost) / c.worker.theta
            least = min(after(c) for c in admissible)
            choice = self.in_turn([c for c in admissible if after(c) == least])
            return choice, "no prefix match anywhere: least loaded after this request, ties in turn"
        if best.worker.admissible:
            return best, f"longest prefix match ({best.matched_blocks} blocks)"
        alt = max(admissible, key=rank)
        # Best worker is saturated. Wait for it, or recompute the prefix on a worker with room?
        # Both finish after the work ahead of them plus their own cost (equal-speed workers).
        ahead = best.worker.inflight_flops + self.queued_cost_before(job, best.worker)
        wait_finish = ahead + best.cost
        extra = max(0.0, alt.cost - best.cost)
        spill_finish = alt.worker.inflight_flops + alt.cost
        now = self.clock()
        if job.wait_started is None:
            job.wait_started = now
            job.wait_limit_s = self.wait_limit(best.worker, wait_finish)
        waited = now - job.wait_started
        sooner = spill_finish + extra < wait_finish
        if sooner or waited >= job.wait_limit_s:
            if self.defer_spills:
                job.waiting_for, job.waiting_cost = best.worker.id, best.cost
                return None, (f"{DEFERRED} to {alt.worker.id}: room goes first to queued jobs that recompute "
                              "nothing (first pass of the pump)")
            if sooner:
                return alt, (f"{SPILL}: best {best.worker.id} ({best.matched_blocks} blocks) is saturated; finishing "
                             f"here ({spill_finish:.3g} FLOPs ahead and own) plus the {extra:.3g} extra FLOPs it "
                             f"adds beats waiting behind {ahead:.3g}")
            return alt, (f"{SPILL}: waited {waited:.1f} s (since the wait started; limit {job.wait_limit_s:.1f} s) "
                         f"for saturated {best.worker.id}")
        job.waiting_for, job.waiting_cost = best.worker.id, best.cost
        if not log.isEnabledFor(logging.DEBUG):  # only a debug log reads why (a job in a backlog waits many times)
            return None, WAITING
        return None, (f"waiting for {best.worker.id} ({best.matched_blocks} blocks, {waited:.1f} s of at most "
                      f"{job.wait_limit_s:.1f} s so far; a spill would add {extra:.3g} FLOPs)")

    def home_of(self, job: Job) -> str | None:
        """Id of the worker ``job``'s prefix was last placed on (``prefix_homes``; single-prompt jobs)."""
        if self.homes is None or len(job.keys) != 1:
            return None
        return self.homes.home(job.keys[0])

    def to_home(self, job: Job, home: Candidate) -> Decision | None:
        """A job matching nothing anywhere, scored on its prefix's home: there if it has room; in the pump's
        first pass, deferred while the home is saturated; else None (the job is placed by load)."""
        if home.worker.admissible:
            return home, f"no prefix match anywhere; its prefix last went to {home.worker.id}"
        if self.defer_spills:
            job.waiting_for, job.waiting_cost = home.worker.id, home.cost
            return None, (f"{DEFERRED}: no prefix match anywhere and its prefix's home {home.worker.id} is "
                          "saturated; room goes first to the jobs whose home it is (first pass of the pump)")
        return None

    def wait_limit(self, worker: Worker, wait_flops: float) -> float:
        """Seconds a job may wait for saturated ``worker``: twice the ``wait_flops`` ahead of it (its own
        included) at the worker's observed (else profiled) FLOPs/s, within [``max_affinity_wait_s``,
        ``MAX_WAIT_LIMIT_S``]."""
        rate = worker.observed_flops_per_s(self.clock()) or worker.profiled_flops_per_s
        floor = self.cfg.max_affinity_wait_s
        return min(max(floor, MAX_WAIT_LIMIT_S), max(floor, 2.0 * wait_flops / rate)) if rate else floor
