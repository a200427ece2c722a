"""The load-ordered fast path: the same decision as scoring every worker, from a few candidates.

With one Θ and one FLOPs model for all workers (``LoadOrder.uniform``), every worker holding nothing of
the job costs the same, and each ordering the policies use (load; load after the job) is monotone in
in-flight FLOPs, so the best of those workers is found in the load order. Only the workers holding a
prefix of the job and those few representatives are scored. Among the holders of a prefix, the policy's
rank is (matched blocks, lower load, higher id): the longest group first, then load order. A job matching
nothing anywhere takes the least-loaded worker, ties in turn (``LoadOrder.least_in_turn``), as the policy
does. A job without
block keys (no affinity) is placed by load alone: the least-loaded admissible worker, ties in turn.
"""

from __future__ import annotations

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.candidates import Candidate, job_cost, score_matched, score_one
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.load_order import LoadOrder
from sgl_moe.router.placement.policy import BY_LOAD, Decision, PlacementPolicy


class FastPath:
    """Decides in a uniform ``LoadOrder`` view exactly what ``PlacementPolicy.choose(score_all(...))`` decides."""

    def __init__(self, cfg: RouterConfig, index: BlockIndex, policy: PlacementPolicy) -> None:
        self.cfg = cfg
        self.index = index
        self.policy = policy

    def decide(self, job: Job, view: LoadOrder, workers: list[Worker]) -> Decision | None:
        policy = self.cfg.policy
        if not job.affinity and policy != "round_robin":
            return self._decide_by_load(job, view)
        if len(job.prompt_lens) != 1 or not view.single_slot:
            return self._decide_among_matched(job, view, workers)
        keys = job.keys[0] if job.keys else []
        groups = self.index.match_groups(keys, view.mask) if keys else []
        if policy == "round_robin":
            w = self.policy.next_round_robin(job, workers)
            if w is None:
                return None
            return score_one(job, w, groups), "round robin"
        if not view.any_admissible():
            return None
        job.waiting_for = None
        theta = view.theta
        if policy == "least_flops":
            w = view.least(lambda x: x / theta, highest_id=False)
            return score_one(job, w, groups), "least in-flight FLOPs / Θ"
        if not groups:  # every worker costs the same: its prefix's home, else least loaded, ties in turn
            home_id = self.policy.home_of(job)
            if home_id is not None:
                home = next((w for w in workers if w.id == home_id), None)
                decision = self.policy.to_home(job, score_one(job, home, groups)) if home is not None else None
                if decision is not None:
                    return decision
            w = view.least_in_turn(self.policy.last_by_load)
            self.policy.took_by_load(w)
            return score_one(job, w, groups), "no prefix match anywhere: least loaded after this request, ties in turn"
        best = score_one(job, view.best_in(groups[0][1], admissible=False), groups)
        if best.worker.admissible:
            return best, f"longest prefix match ({best.matched_blocks} blocks)"
        alt_w = None
        for _, mask in groups:
            alt_w = view.best_in(mask, admissible=True)
            if alt_w is not None:
                break
        else:
            matched = 0
            for _, mask in groups:
                matched |= mask
            alt_w = view.least(lambda x: x / theta, highest_id=True, skip=matched)
        alt = score_one(job, alt_w, groups)
        return self.policy.longest_block_match(job, [best, alt], [alt])

    def _decide_by_load(self, job: Job, view: LoadOrder) -> Decision | None:
        """``PlacementPolicy.by_load`` in the load order: no worker holds anything of a job without keys."""
        w = view.least_in_turn(self.policy.last_by_load)
        if w is None:
            return None
        job.waiting_for = None
        self.policy.took_by_load(w)
        rank, slot = min(w.slots.items())  # nothing matched: the lowest DP rank, as score_all picks
        zero = (0,) * len(job.prompt_lens)
        return Candidate(w, slot, rank, 0, zero, job_cost(w, job, list(zero))), BY_LOAD

    def _decide_among_matched(self, job: Job, view: LoadOrder, workers: list[Worker]) -> Decision | None:
        """Several prompts or DP ranks: every worker holding a prefix, scored, plus the least-loaded
        admissible other worker by each key the policy uses."""
        policy = self.cfg.policy
        if policy == "round_robin":
            w = self.policy.next_round_robin(job, workers)
            if w is None:
                return None
            cands, _ = score_matched(self.index, job, view)
            zero = (0,) * len(job.prompt_lens)
            choice = next((c for c in cands if c.worker is w), None)
            if choice is None:
                rank, slot = min(w.slots.items())  # nothing matched: the lowest DP rank, as score_all picks
                choice = Candidate(w, slot, rank, 0, zero, job_cost(w, job, list(zero)))
            return choice, "round robin"
        cands, skip = score_matched(self.index, job, view)
        theta = view.theta
        zero = (0,) * len(job.prompt_lens)
        free = job_cost(workers[0], job, list(zero))
        reps = [view.least(lambda x: x / theta, highest_id=policy != "least_flops", skip=skip)]
        if policy != "least_flops":
            # When the first prompt matches nowhere the policy takes the least loaded after the job, ties in
            # turn: among the workers holding nothing, that is the least loaded, ties in turn.
            reps.append(view.least_in_turn(self.policy.last_by_load, skip=skip))
        home_id = self.policy.home_of(job)
        if home_id is not None and not any(c.worker.id == home_id for c in cands):
            reps.append(next((w for w in workers if w.id == home_id), None))  # the policy may send it home
        for w in dict.fromkeys(r for r in reps if r is not None):
            rank, slot = min(w.slots.items())  # nothing matched: the lowest DP rank, as score_all picks
            cands.append(Candidate(w, slot, rank, 0, zero, free))
        return self.policy.choose(job, cands)
