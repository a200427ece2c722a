"""The split balances cost, not count; a batch of one has nothing to overlap."""

from sgl_moe.overlap.costs import CostModel
from sgl_moe.overlap.solver import Solver
from sgl_moe.overlap.split import balanced_split, count_split

MODEL = CostModel(attn_alpha=0.0, attn_beta=1e-8, attn_gamma=1e-6, moe_alpha=0.0, moe_beta=6e-5)


def test_cost_split_beats_count_split_on_skewed_contexts():
    contexts = [32_000, 30_000, 28_000] + [500] * 13  # three long chats ahead of short ones
    n = [1] * len(contexts)
    by_cost, by_count = balanced_split(n, contexts, MODEL), count_split(n, contexts, MODEL)
    assert abs(by_cost.cost_a - by_cost.cost_b) < 0.5 * abs(by_count.cost_a - by_count.cost_b)
    # …and the pipeline it feeds is shorter.
    solver = Solver(MODEL, layers=8, placement="cpu-experts")
    tok = lambda s: (len(s.a), len(s.b))  # noqa: E731
    nc = lambda s: (sum(contexts[i] for i in s.a), sum(contexts[i] for i in s.b))  # noqa: E731
    assert solver.makespan(tok(by_cost), nc(by_cost), "ab") < 0.9 * solver.makespan(tok(by_count), nc(by_count), "ab")


def test_split_is_contiguous_and_complete():
    contexts = [100, 9000, 5, 70, 4000, 4000, 12]
    s = balanced_split([1] * 7, contexts, MODEL)
    assert s.a + s.b == tuple(range(7)) and s.a and s.b
    assert s.rows() == (slice(0, s.point), slice(s.point, 7))


def test_batch_of_one_has_an_empty_side_and_no_overlap():
    s = balanced_split([1], [4096], MODEL)
    assert s.a == (0,) and s.b == () and not s.overlap
    plan = Solver(MODEL, layers=4, placement="cpu-experts").plan([1], [4096])
    assert not plan.overlap and "batch of 1" in plan.reason and plan.predicted_makespan == plan.predicted_sequential
