"""Workers of one kind share the median of their calibrations (``calibration_pool``), through the pool's joins,
installs and removals; pins and ``--no-pool-calibrations`` win; workers of another kind keep their own."""

from __future__ import annotations

from dataclasses import replace

from sgl_moe.flops import FlopsModel
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.calibration_pool import kind_of
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.wire import SaturationInfo, WorkerInfo

FLOPS = FlopsModel(linear_flops_per_token=1000.0, attn_flops_per_pair=10.0, lm_head_flops_per_token=100.0,
                   num_layers=2, num_moe_layers=2)
BASE = WorkerInfo(model_name="m", page_size=16, flops=FLOPS, context_length=4096, device="cpu",
                  saturation=SaturationInfo(1e9, "fallback", "calibrating", step_tokens=4096))


def info(theta: float, overhead: float, state: str = "calibrated", **changes) -> WorkerInfo:
    sat = SaturationInfo(theta, f"profile {theta:.3g}", state, step_tokens=4096, request_overhead_flops=overhead)
    return replace(BASE, saturation=sat, **changes)


def pool(**cfg) -> WorkerPool:
    index = BlockIndex()
    return WorkerPool.without_http(RouterConfig(**cfg), index, PendingLedger(index, 10.0), on_change=lambda: None)


def test_three_workers_of_one_kind_take_the_median_and_the_fast_path_sees_one_theta():
    # The bench-model matrix's three profiles (matrix-bench-model-24153cb.json), rounded.
    p = pool()
    a = p.admit("http://a", info(4.25e10, 1.2e9))
    assert (a.theta, a.request_overhead_flops) == (4.25e10, 1.2e9)  # alone: its own
    b = p.admit("http://b", info(8.21e10, 0.86e9))
    c = p.admit("http://c", info(2.63e10, 3.75e9))
    assert {w.theta for w in (a, b, c)} == {4.25e10}
    assert {w.request_overhead_flops for w in (a, b, c)} == {1.2e9}
    assert "median of 3" in c.theta_source and "its own: profile 2.63e+10" in c.theta_source
    assert c.info.saturation.flops == 2.63e10  # the worker's own report stays as it sent it
    installs = p.installs
    p.install(b, info(3e10, 0.9e9))  # b recalibrated: the kind's median moves to 3e10
    assert {w.theta for w in (a, b, c)} == {3e10} and p.installs > installs + 1


def test_the_pooled_values_are_logged_when_they_change_not_on_every_install(caplog):
    p = pool()
    a = p.admit("http://a", info(2e10, 1e9))
    with caplog.at_level("INFO", logger="sgl_moe.router.workers"):
        b = p.admit("http://b", info(4e10, 3e9))
        p.install(a, info(2e10, 1e9))  # the same report again: the kind's median is unchanged
        p.install(b, info(4e10, 3e9))
    assert [r.getMessage() for r in caplog.records if "pooled" in r.getMessage()] == [
        "pooled calibrations: workers w0, w1: one kind; Θ 3e+10 FLOPs (median of 2e+10, 4e+10), request overhead "
        "2e+09 FLOPs (median of 1e+09, 3e+09)"]
    assert {w.theta for w in (a, b)} == {3e10}  # each install reset its worker's own values; pooling restored them


def test_a_worker_that_did_not_measure_adopts_its_kinds_median_but_is_no_sample():
    p = pool()
    a = p.admit("http://a", info(4e10, 1e9))
    b = p.admit("http://b", info(6e10, 3e9))
    d = p.admit("http://d", info(5e8, 0.0, state="disturbed"))
    assert {w.theta for w in (a, b, d)} == {5e10}  # the median of a and b; d's fallback is not a sample
    assert {w.request_overhead_flops for w in (a, b, d)} == {2e9}


def test_removing_a_worker_recomputes_its_kinds_median():
    p = pool()
    a = p.admit("http://a", info(2e10, 0.0))
    b = p.admit("http://b", info(4e10, 0.0))
    c = p.admit("http://c", info(9e10, 0.0))
    assert a.theta == 4e10
    import asyncio

    asyncio.run(p.remove(b.id))
    assert (a.theta, c.theta) == (5.5e10, 5.5e10)


def test_workers_of_another_kind_keep_their_own():
    p = pool()
    a = p.admit("http://a", info(2e10, 1e9))
    b = p.admit("http://b", info(4e10, 2e9))
    g = p.admit("http://g", info(9e11, 5e9, device="cuda: NVIDIA H100"))
    o = p.admit("http://o", info(7e10, 4e9, moe_args={"expert_offload": True}))
    assert (a.theta, b.theta) == (3e10, 3e10)
    assert (g.theta, g.request_overhead_flops) == (9e11, 5e9)
    assert (o.theta, o.request_overhead_flops) == (7e10, 4e9)
    assert len({kind_of(w.info) for w in (a, b, g, o)}) == 3


def test_pins_and_the_flag_win():
    p = pool(saturation_flops=1e10)
    a = p.admit("http://a", info(2e10, 1e9))
    b = p.admit("http://b", info(4e10, 3e9))
    assert (a.theta, b.theta) == (1e10, 1e10)  # pinned Θ
    assert (a.request_overhead_flops, b.request_overhead_flops) == (2e9, 2e9)  # the overhead is still pooled
    p = pool(request_overhead_flops=5e8)
    a = p.admit("http://a", info(2e10, 1e9))
    b = p.admit("http://b", info(4e10, 3e9))
    assert (a.theta, b.theta, a.request_overhead_flops, b.request_overhead_flops) == (3e10, 3e10, 5e8, 5e8)
    p = pool(pool_calibrations=False)
    a = p.admit("http://a", info(2e10, 1e9))
    b = p.admit("http://b", info(4e10, 3e9))
    assert (a.theta, b.theta, a.request_overhead_flops, b.request_overhead_flops) == (2e10, 4e10, 1e9, 3e9)
