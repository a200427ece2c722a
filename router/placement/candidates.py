"""Scoring: what a job costs on each worker given the prefix that worker holds (seed 000 Eq. 2).

- **Cost**: FLOPs of the prompt tokens a worker must still compute after the prefix it holds (committed
  or pending blocks), attention counted for causal masks, plus the expected decode FLOPs when more than
  one token is generated.
- A worker with several attention-DP ranks is scored on the rank holding the longest prefix of the first
  prompt; SGLang recomputes at least the last prompt token (it needs its logits).

``score_all`` scores every given worker (the reference); ``score_matched`` and ``score_one`` score only
what the load-ordered fast path asks for, with the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from sgl_moe.flops import FlopsModel
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.load_order import LoadOrder


@dataclass(slots=True, init=False)
class Candidate:
    """One worker scored for one job. (``__init__`` is written out: compiled, it runs as C; the one ``dataclass``
    writes runs interpreted, as do all such initialisers, once per decision.)"""

    worker: Worker
    slot: int
    dp_rank: int
    matched_blocks: int
    cached_tokens: tuple[int, ...]
    cost: float

    def __init__(self, worker: Worker, slot: int, dp_rank: int, matched_blocks: int, cached_tokens: tuple[int, ...],
                 cost: float) -> None:
        self.worker = worker
        self.slot = slot
        self.dp_rank = dp_rank
        self.matched_blocks = matched_blocks
        self.cached_tokens = cached_tokens
        self.cost = cost

    @property
    def load(self) -> float:
        return self.worker.inflight_flops / self.worker.theta


def prefill_cost(worker: Worker, cached: int, new: int) -> float:
    """``worker.request_overhead_flops + worker.flops.request_flops(cached, new)`` (``cached``, ``new`` >= 0), the same
    float: the formula written here runs compiled (``FlopsModel.request_flops`` runs interpreted, a step or more per
    decision)."""
    f = worker.flops
    pairs = new * cached + new * (new + 1) / 2
    return worker.request_overhead_flops + (new * f.linear_flops_per_token + pairs * f.attn_flops_per_pair + (
        f.lm_head_flops_per_token if new else 0.0))


def job_cost(worker: Worker, job: Job, cached: list[int] | tuple[int, ...]) -> float:
    """FLOPs the worker spends on the job given the cached prefix of each prompt (Eq. 2, causal).

    Prompts of one request that share a prefix (``/v1/score`` items after their query) compute it once.
    Every prompt also costs the worker's fixed per-request work (``Worker.request_overhead_flops``).
    """
    f = worker.flops
    lens = job.prompt_lens
    if len(lens) == 1 and job.max_new_tokens == 1:  # one prompt, prefill only (the common case, in short)
        c = cached[0]
        return prefill_cost(worker, c, lens[0] - c)
    total = worker.request_overhead_flops * len(lens)
    shared = job.shared_prefix_len
    for i, (n, c) in enumerate(zip(job.prompt_lens, cached)):
        if i > 0 and shared:
            c = max(c, min(shared, n - 1))
        total += f.request_flops(c, n - c)
        extra = job.max_new_tokens - 1
        if extra > 0:  # decode: each further token is one position attending to the whole context
            total += extra * (f.linear_flops_per_token + f.lm_head_flops_per_token)
            total += f.attn_flops_per_pair * (extra * n + extra * (extra + 1) / 2)
    return total


def score_all(index: BlockIndex, job: Job, workers: list[Worker]) -> list[Candidate]:
    """Every worker of ``workers`` scored."""
    mask = 0
    for w in workers:
        for slot in w.slots.values():
            mask |= 1 << slot
    n_prompts = len(job.prompt_lens)
    matches = [index.match(keys, mask) for keys in job.keys if keys]
    matches += [{}] * (n_prompts - len(matches))
    first = matches[0] if matches else {}
    matched_slots = set().union(*matches) if n_prompts > 1 else set(first)
    zero = (0,) * n_prompts
    zero_cost: dict[tuple[FlopsModel, float], float] = {}
    costs: dict[tuple, float] = {}  # workers with the same model and the same hits cost the same
    out = []
    for w in workers:
        slots = w.slots
        if len(slots) == 1:
            (rank, slot), = slots.items()
        else:  # the attention-DP rank holding the longest prefix of the first prompt takes the request
            rank, slot = max(slots.items(), key=lambda rs: (first.get(rs[1], 0), -rs[0]))
        if slot not in matched_slots:
            cost = zero_cost.get(w.cost_model)
            if cost is None:
                cost = zero_cost[w.cost_model] = job_cost(w, job, list(zero))
            out.append(Candidate(w, slot, rank, 0, zero, cost))
            continue
        page = w.page_size
        # SGLang recomputes at least the last prompt token (it needs its logits).
        cached = tuple(min(m.get(slot, 0) * page, ((n - 1) // page) * page)
                       for n, m in zip(job.prompt_lens, matches))
        key = (w.cost_model, cached)
        cost = costs.get(key)
        if cost is None:
            cost = costs[key] = job_cost(w, job, list(cached))
        out.append(Candidate(w, slot, rank, first.get(slot, 0), cached, cost))
    return out


def score_matched(index: BlockIndex, job: Job, view: LoadOrder) -> tuple[list[Candidate], int]:
    """The workers of ``view`` holding a prefix of some prompt, scored as ``score_all`` scores them, and the
    slot mask of those workers (every other worker holds nothing of the job)."""
    n_prompts = len(job.prompt_lens)
    matches = [index.match(keys, view.mask) for keys in job.keys if keys]
    matches += [{}] * (n_prompts - len(matches))
    first = matches[0] if matches else {}
    matched_slots = set().union(*matches) if n_prompts > 1 else set(first)
    zero = (0,) * n_prompts
    owner = view.owner
    matched_workers = {owner[s].id: owner[s] for s in matched_slots}
    out = []
    skip = 0
    costs: dict[tuple, float] = {}
    for w in matched_workers.values():
        skip |= view.bits[w.id]
        slots = w.slots
        if len(slots) == 1:
            (rank, slot), = slots.items()
        else:
            rank, slot = max(slots.items(), key=lambda rs: (first.get(rs[1], 0), -rs[0]))
        if slot not in matched_slots:
            out.append(Candidate(w, slot, rank, 0, zero, job_cost(w, job, list(zero))))
            continue
        page = w.page_size
        cached = tuple(min(m.get(slot, 0) * page, ((n - 1) // page) * page)
                       for n, m in zip(job.prompt_lens, matches))
        cost = costs.get(cached)
        if cost is None:
            cost = costs[cached] = job_cost(w, job, list(cached))
        out.append(Candidate(w, slot, rank, first.get(slot, 0), cached, cost))
    return out, skip


def score_one(job: Job, w: Worker, groups: list[tuple[int, int]]) -> Candidate:
    """One single-slot worker scored for a one-prompt job, given the match as ``BlockIndex.match_groups``."""
    (rank, slot), = w.slots.items()
    bit = 1 << slot
    blocks = 0
    for b, mask in groups:
        if mask & bit:
            blocks = b
            break
    lens = job.prompt_lens
    n = lens[0]
    prefill = len(lens) == 1 and job.max_new_tokens == 1  # ``job_cost``'s common case, inlined below
    if not blocks:
        if prefill:
            return Candidate(w, slot, rank, 0, (0,), prefill_cost(w, 0, n))
        return Candidate(w, slot, rank, 0, (0,), job_cost(w, job, [0]))
    page = w.page_size
    c = min(blocks * page, ((n - 1) // page) * page)
    if prefill:
        return Candidate(w, slot, rank, blocks, (c,), prefill_cost(w, c, n - c))
    return Candidate(w, slot, rank, blocks, (c,), job_cost(w, job, [c]))
