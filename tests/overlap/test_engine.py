"""Overlapped placements (emulated by threads on a CPU) compute what the sequential path computes."""

import dataclasses

import pytest
import torch

from sgl_moe.overlap.engine import DependencyError, DualBatchRunner
from sgl_moe.overlap.layers import DecodeLayers, PrefillLayers
from sgl_moe.overlap.solver import Solver
from sgl_moe.streaming.lanes import LaneError

BATCHES = [[40], [16, 40], [16, 40, 8, 64, 32], [5, 60, 60, 7, 9, 33, 12, 50]]


@pytest.mark.parametrize("placement", ["streams", "cpu-experts"])
@pytest.mark.parametrize("contexts", BATCHES, ids=lambda c: f"b{len(c)}")
def test_decode_placements_equal_sequential(decode_stack, model, placement, contexts):
    ops = DecodeLayers(decode_stack, contexts)
    x = ops.inputs(seed=3)
    plan = Solver(model, ops.cfg.layers, placement, force_overlap=True).plan([1] * len(contexts), contexts)
    reference, runner = DualBatchRunner(ops, "sequential"), DualBatchRunner(ops, placement)
    try:
        whole = reference.run(x)
        if len(contexts) == 1:
            assert not plan.overlap and "batch of 1" in plan.reason
            assert torch.equal(runner.run(x, plan), whole)
            return
        assert plan.overlap and 1 <= plan.split.point < len(contexts)
        for p in (plan, dataclasses.replace(plan, order="ba" if plan.order == "ab" else "ab")):
            out = runner.run(x, p)
            assert torch.equal(out, reference.run(x, p))  # same micro-batches in turn: bit for bit
            assert torch.equal(out, runner.run(x, p, serial=True))
            torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)  # unsplit: GEMM shapes differ
            assert not torch.equal(out, x)
    finally:
        runner.close()


def test_prefill_streams_equal_sequential(prefill_stack, model):
    ops = PrefillLayers(prefill_stack, batch=4, seq=12)
    x = ops.inputs()
    plan = Solver(model, ops.cfg.layers, "streams", force_overlap=True).plan([12] * 4, [12] * 4)
    reference, runner = DualBatchRunner(ops, "sequential"), DualBatchRunner(ops, "streams")
    try:
        out = runner.run(x, plan)
        assert torch.equal(out, reference.run(x, plan))
        torch.testing.assert_close(out, reference.run(x), rtol=1e-5, atol=1e-5)
    finally:
        runner.close()


def test_slow_experts_change_nothing(decode_stack, model):
    ops = DecodeLayers(decode_stack, [10, 20, 30, 40])
    x = ops.inputs(seed=4)
    plan = Solver(model, ops.cfg.layers, "cpu-experts", force_overlap=True).plan([1] * 4, ops.contexts)
    runner = DualBatchRunner(ops, "cpu-experts", moe_delay_s=0.01)
    try:
        assert torch.equal(runner.run(x, plan), DualBatchRunner(ops, "sequential").run(x, plan))
    finally:
        runner.close()


@pytest.mark.parametrize("placement, error", [("cpu-experts", DependencyError), ("streams", LaneError)])
def test_skipping_the_moe_wait_is_detected(decode_stack, model, placement, error):
    """Negative control: attention of layer l+1 no longer waits its MoE of layer l (experts made slow)."""
    ops = DecodeLayers(decode_stack, [10, 20, 30, 40])
    plan = Solver(model, ops.cfg.layers, placement, force_overlap=True).plan([1] * 4, ops.contexts)
    runner = DualBatchRunner(ops, placement, moe_delay_s=0.05, skip_moe_wait=True)
    try:
        with pytest.raises(error, match="before"):
            runner.run(ops.inputs(seed=5), plan)
    finally:
        runner.close()


def test_task_times_and_concurrency_are_measured(decode_stack):
    ops = DecodeLayers(decode_stack, [32] * 4)
    runner = DualBatchRunner(ops, "streams")
    try:
        t_attn, t_moe = runner.time_tasks(slice(0, 4), reps=2)
        assert t_attn > 0 and t_moe > 0
        assert runner.time_concurrent(slice(0, 2), slice(2, 4), reps=2) > 0
    finally:
        runner.close()


@pytest.mark.parametrize("placement", ["streams", "cpu-experts"])
def test_worker_threads_run_in_the_callers_inference_mode(decode_stack, model, placement):
    """A server runs its forward under inference_mode, which is thread-local: the lanes' threads must too
    (else writing the inference-mode output, or a server's KV cache, from a worker thread fails)."""
    ops = DecodeLayers(decode_stack, [10, 20, 30, 40])
    plan = Solver(model, ops.cfg.layers, placement, force_overlap=True).plan([1] * 4, ops.contexts)
    runner = DualBatchRunner(ops, placement)
    try:
        with torch.inference_mode():
            x = ops.inputs(seed=5)
            out = runner.run(x, plan)
        assert out.is_inference()
        assert torch.equal(out, DualBatchRunner(ops, "sequential").run(ops.inputs(seed=5), plan))
    finally:
        runner.close()


def test_a_failed_task_is_reported_once_with_its_cause():
    from sgl_moe.streaming.lanes import ThreadLane

    lane = ThreadLane("overlap-attn")
    try:
        first = lane.submit(lambda: 1 / 0, [])
        second = lane.submit(lambda: None, [first])
        with pytest.raises(LaneError, match=r"^overlap-attn lane task failed: ZeroDivisionError") as info:
            second.wait()
        assert isinstance(info.value.__cause__, ZeroDivisionError)
    finally:
        lane.close()
