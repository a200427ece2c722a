"""Dual micro-batch placements on CUDA (marker ``gpu``; skipped without a GPU).

``streams`` (two CUDA streams) and ``cpu-experts`` (attention on the GPU, experts on the CPU) equal the same
micro-batches run in turn, bit for bit, as on the CPU: each micro-batch meets the same kernels on the same
rows whatever the placement, and cross-stream tensors are fenced and ``record_stream``-ed. Against the
unsplit batch: a tolerance, since GEMMs of different row counts may pick different kernels (float32:
1e-5; bf16: relative error < 1e-2, bf16 operands, METHOD.md). On ``cpu-experts`` the experts' product is
the CPU's, so its output is compared with the sequential placement run the same way (experts on the CPU).

``SGL_MOE_GPU_TEST_DEVICE=cpu`` runs them on the CPU (a dry run of this file's code).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sgl_moe.offload.decode_stack import DecodeStack
from sgl_moe.overlap.costs import CostModel
from sgl_moe.overlap.engine import DualBatchRunner
from sgl_moe.overlap.layers import DecodeLayers, PrefillLayers
from sgl_moe.overlap.solver import Solver
from sgl_moe.streaming.gpu_timing import gpu_test_device
from sgl_moe.streaming.moe_stack import MoEStack, MoEStackConfig

DEVICE = gpu_test_device()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")]
MODEL = CostModel(attn_alpha=1e-5, attn_beta=1e-7, attn_gamma=1e-6, moe_alpha=1e-5, moe_beta=1e-5)


def _cfg(dtype: str) -> MoEStackConfig:
    return MoEStackConfig(hidden=128, heads=4, kv_heads=2, head_dim=32, experts=16, top_k=4, expert_width=64,
                          layers=3, dtype=dtype)


def _same_as_sequential(out: torch.Tensor, seq: torch.Tensor) -> None:
    """The same micro-batches on the caller's stream. CUDA: bit for bit (kernels do not depend on the issuing
    thread). The CPU dry run emulates streams with worker threads whose OpenMP thread count (1) differs from
    the caller's, so float32 GEMM reductions split differently there: close, not equal."""
    if DEVICE == "cuda" or out.dtype != torch.float32:
        assert torch.equal(out, seq)
    else:
        torch.testing.assert_close(out, seq, rtol=1e-5, atol=1e-5)


def _close_to_unsplit(out: torch.Tensor, whole: torch.Tensor) -> None:
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)
    else:
        assert float((out.float() - whole.float()).norm() / whole.float().norm()) < 1e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_streams_equal_in_turn(dtype):
    ops = PrefillLayers(MoEStack(_cfg(dtype), DEVICE, seed=2), batch=4, seq=48)
    x = ops.inputs()
    plan = Solver(MODEL, ops.cfg.layers, "streams", force_overlap=True).plan([48] * 4, [48] * 4)
    assert plan.overlap
    reference, runner = DualBatchRunner(ops, "sequential"), DualBatchRunner(ops, "streams")
    try:
        for p in (plan, dataclasses.replace(plan, order="ba" if plan.order == "ab" else "ab")):
            for _ in range(2):
                out = runner.run(x, p)
                assert torch.equal(out, runner.run(x, p, serial=True))
                _same_as_sequential(out, reference.run(x, p))
            _close_to_unsplit(out, reference.run(x))
    finally:
        runner.close()
        reference.close()


@pytest.mark.parametrize("placement", ["streams", "cpu-experts"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_placements_equal_in_turn(placement, dtype):
    contexts = [16, 40, 8, 64, 32, 20]
    ops = DecodeLayers(DecodeStack(_cfg(dtype), DEVICE, context=64, seed=4), contexts)
    x = ops.inputs(seed=3)
    plan = Solver(MODEL, ops.cfg.layers, placement, force_overlap=True).plan([1] * len(contexts), contexts)
    assert plan.overlap
    runner = DualBatchRunner(ops, placement)
    try:
        whole = runner.run(x)  # the batch in turn on this placement (cpu-experts: experts on the CPU)
        for _ in range(2):
            out = runner.run(x, plan)
            assert torch.equal(out, runner.run(x, plan, serial=True))
        if placement == "streams":
            _same_as_sequential(out, DualBatchRunner(ops, "sequential").run(x, plan))
        _close_to_unsplit(out, whole)
        assert out.device.type == torch.device(DEVICE).type
    finally:
        runner.close()
