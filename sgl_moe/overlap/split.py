"""Split a batch into two micro-batches of equal *cost*, not equal count.

A sequence's share of a layer is cost_i = β_a·n_i·c_i + (γ_a + β_m)·n_i (``CostModel.seq_cost``): a few
long-context sequences weigh as much as many short ones. Partitions are *contiguous*: micro-batch A is
sequences [0, k), B is [k, B). Each keeps the scheduler's order, and each is a view of the batch's hidden
states and KV cache (no gather per layer). A greedy (LPT) partition balances slightly better on adversarial
inputs but scatters rows, which costs a gather of the KV cache per layer in a padded layout.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from sgl_moe.overlap.costs import CostModel


@dataclass(frozen=True)
class Split:
    """Micro-batch A = sequences ``a``, B = sequences ``b`` (indices into the batch, in order)."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    cost_a: float
    cost_b: float

    @property
    def point(self) -> int:
        """A's size: A = [0, point), B = [point, batch)."""
        return len(self.a)

    @property
    def overlap(self) -> bool:
        """False when one side is empty (a batch of one sequence): nothing to overlap with."""
        return bool(self.a) and bool(self.b)

    def rows(self) -> tuple[slice, slice]:
        return slice(0, len(self.a)), slice(len(self.a), len(self.a) + len(self.b))


def seq_costs(new_tokens: Sequence[int], contexts: Sequence[int], model: CostModel) -> list[float]:
    if len(new_tokens) != len(contexts):
        raise ValueError(f"{len(new_tokens)} new-token counts but {len(contexts)} contexts")
    return [model.seq_cost(n, c) for n, c in zip(new_tokens, contexts)]


def split_at(costs: Sequence, point: int, prefix: Sequence[float] | None = None) -> Split:
    """A = [0, point), B = [point, len). ``prefix`` (the costs' prefix sums), when given, supplies the
    costs, and ``costs`` only its length."""
    if not 0 <= point <= len(costs):
        raise ValueError(f"split point {point} outside [0, {len(costs)}]")
    if len(costs) > 1 and point in (0, len(costs)):
        raise ValueError("an empty micro-batch is allowed only for a batch of one sequence")
    pre = list(accumulate(costs, initial=0.0)) if prefix is None else prefix
    return Split(tuple(range(point)), tuple(range(point, len(costs))), pre[point], pre[-1] - pre[point])


def balanced_point(prefix: Sequence[float]) -> int:
    """The point in [1, B-1] whose two sides' costs differ least (prefix sums, O(log B))."""
    size = len(prefix) - 1
    if size <= 1:
        return size
    half = prefix[-1] / 2
    k = bisect.bisect_left(prefix, half, 1, size)
    best = min((p for p in (k - 1, k) if 1 <= p <= size - 1), key=lambda p: abs(prefix[-1] - 2 * prefix[p]))
    return best


def balanced_split(new_tokens: Sequence[int], contexts: Sequence[int], model: CostModel) -> Split:
    """Contiguous split with the least cost imbalance; a batch of one is (all, empty): overlap off."""
    costs = seq_costs(new_tokens, contexts, model)
    if not costs:
        raise ValueError("empty batch")
    prefix = list(accumulate(costs, initial=0.0))
    return split_at(costs, balanced_point(prefix), prefix)


def count_split(new_tokens: Sequence[int], contexts: Sequence[int], model: CostModel) -> Split:
    """Half the sequences each side (what a count-balanced split does); for comparison."""
    costs = seq_costs(new_tokens, contexts, model)
    return split_at(costs, (len(costs) + 1) // 2 if len(costs) > 1 else len(costs))
