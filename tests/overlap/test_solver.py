"""The solver's makespan is the pipeline's (an independent list-scheduling simulation), its choice is the
best over every split and order on hand-built cases, it is fast, and it caches by shape."""

import random
import statistics
import time

import pytest

from sgl_moe.overlap.costs import CostModel
from sgl_moe.overlap.solver import Solver, two_resource_makespan


def simulate(a: tuple[float, float], m: tuple[float, float], lead: int, layers: int) -> float:
    """Brute force: explicit task lists per resource, each task starts when its resource is free and its
    predecessor (same micro-batch, previous task) is done; no max-plus shortcut, every layer simulated."""
    order = [lead, 1 - lead]
    res_free = {"attn": 0.0, "moe": 0.0}
    done = {0: 0.0, 1: 0.0}  # each micro-batch's last finished task
    for _ in range(layers):
        for kind, cost in (("attn", a), ("moe", m)):
            for mb in order:
                start = max(res_free[kind], done[mb])
                res_free[kind] = done[mb] = start + cost[mb]
    return max(done.values())


def exhaustive(model: CostModel, layers: int, contexts: list[int]) -> tuple[float, int, str]:
    best = None
    for k in range(1, len(contexts)):
        tok = (k, len(contexts) - k)
        nc = (sum(contexts[:k]), sum(contexts[k:]))
        a = tuple(model.attention_s(tok[i], nc[i]) for i in (0, 1))
        m = tuple(model.moe_s(tok[i]) for i in (0, 1))
        for order, lead in (("ab", 0), ("ba", 1)):
            t = simulate(a, m, lead, layers)
            if best is None or t < best[0] - 1e-15:
                best = (t, k, order)
    return best


def test_makespan_equals_brute_force_simulation():
    rng = random.Random(0)
    for _ in range(300):
        a = (rng.uniform(0.1, 3), rng.uniform(0.1, 3))
        m = (rng.uniform(0.1, 3), rng.uniform(0.1, 3))
        layers = rng.randint(1, 60)
        for lead in (0, 1):
            got = two_resource_makespan(a[lead], m[lead], a[1 - lead], m[1 - lead], layers)
            assert got == pytest.approx(simulate(a, m, lead, layers), rel=1e-9)


def test_equal_halves_hit_the_closed_form():
    # α = 0, four identical sequences, attention = MoE = t per half: fill t, then both resources busy.
    model = CostModel(attn_beta=1e-6, moe_beta=1e-3)
    plan = Solver(model, layers=6, placement="cpu-experts").plan([1] * 4, [1000] * 4)
    t = 2e-3
    assert plan.split.point == 2 and plan.overlap
    assert plan.predicted_makespan == pytest.approx((2 * 6 + 1) * t)
    assert plan.predicted_sequential == pytest.approx(6 * 4 * t)
    assert plan.bound == pytest.approx(0.5) and plan.predicted_gain <= plan.bound


@pytest.mark.parametrize("contexts", [[30_000, 200], [200, 30_000], [9000, 100, 100, 100, 100, 8000],
                                      [50, 60, 70, 20_000, 80, 90, 100, 110]])
def test_solver_finds_the_best_split_and_order(contexts):
    model = CostModel(attn_alpha=2e-5, attn_beta=2e-8, attn_gamma=1e-6, moe_alpha=1e-4, moe_beta=3e-5)
    plan = Solver(model, layers=12, placement="cpu-experts").plan([1] * len(contexts), contexts)
    t, k, order = exhaustive(model, 12, contexts)
    assert plan.overlap and plan.split.point == k and plan.order == order
    assert plan.predicted_makespan == pytest.approx(t, rel=1e-9)


def test_order_matters_when_attention_is_lopsided():
    # Two sequences, one long-context: leading with the short one starts the MoE resource earlier.
    model = CostModel(attn_beta=1e-7, moe_beta=2e-3)
    solver = Solver(model, layers=3, placement="cpu-experts")
    plan = solver.plan([1, 1], [30_000, 100])
    other = "ab" if plan.order == "ba" else "ba"
    assert plan.order == "ba"
    assert plan.predicted_makespan < solver.makespan((1, 1), (30_000, 100), other) - 1e-6


def test_streams_overlap_efficiency_interpolates():
    model = CostModel(attn_beta=1e-6, moe_beta=1e-3)
    full = Solver(model, 4, "streams", eta=1.0).plan([1] * 4, [1000] * 4)
    none = Solver(model, 4, "streams", eta=0.0).plan([1] * 4, [1000] * 4)
    half = Solver(model, 4, "streams", eta=0.5, force_overlap=True).plan([1] * 4, [1000] * 4)
    assert full.overlap and not none.overlap  # η = 0: splitting only costs
    assert half.predicted_makespan == pytest.approx((full.predicted_makespan + full.predicted_sequential) / 2)


def test_no_overlap_when_fixed_costs_dominate():
    model = CostModel(attn_alpha=1e-3, attn_beta=1e-12, moe_alpha=1e-3, moe_beta=1e-9)
    plan = Solver(model, 4, "cpu-experts").plan([1] * 8, [100] * 8)
    assert not plan.overlap and "does not pay" in plan.reason


def test_solve_is_fast():
    model = CostModel(attn_alpha=2e-5, attn_beta=2e-9, attn_gamma=1e-6, moe_alpha=1e-4, moe_beta=3e-5)
    solver = Solver(model, layers=48, placement="cpu-experts")
    rng = random.Random(1)
    times = []
    for _ in range(50):
        contexts = [rng.randint(16, 32_768) for _ in range(256)]
        t0 = time.perf_counter()
        solver.solve([1] * 256, contexts)
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 1e-3


def test_cache_by_shape_and_resolve_on_change():
    model = CostModel(attn_beta=1e-8, moe_beta=1e-5)
    solver = Solver(model, layers=4, placement="cpu-experts", context_bucket=256)
    p1 = solver.plan([1] * 4, [1000, 2000, 3000, 4000])
    assert solver.plan([1] * 4, [1001, 2001, 3001, 4001]) is p1 and solver.solves == 1  # same buckets
    solver.plan([1] * 4, [1000, 2000, 3000, 40_000])  # a context moved bucket
    solver.plan([1] * 5, [1000, 2000, 3000, 4000, 10])  # the batch grew
    assert solver.solves == 3
