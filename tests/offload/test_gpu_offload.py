"""The offload engine on CUDA (marker ``gpu``; skipped without a GPU).

- on_demand and exact decode equal resident experts, speculative with perfect predictions too, and
  speculative with wrong ones equals the same run on resident weights. float32: bit for bit, as on the CPU
  (each expert's rows meet the same per-expert product whichever slot holds the expert). bf16: the grouped
  GEMM runs over slot-ordered groups instead of expert-ordered ones, and nothing promises the same kernel
  tiling for a different group layout, so the check is relative error < 1e-2 (bf16 operands; METHOD.md).
- One synchronizing CUDA call per layer and decode step (the host bookkeeping's read of the layer's ids,
  routed and predicted together), none in the resident reference; counted by torch's sync debug mode.
- ``read_ids`` on device tensors: values and shapes kept.
- A prefetch copy from the pinned store runs inside the compute that follows it (CUDA events on both streams).

``SGL_MOE_GPU_TEST_DEVICE=cpu`` runs the device-independent ones on the CPU (a dry run of this file's code).
"""

from __future__ import annotations

import pytest
import torch

from sgl_moe.offload import OffloadConfig, OffloadEngine
from sgl_moe.offload import engine as engine_module
from sgl_moe.offload.decode_stack import DecodeStack, synthetic_predictions
from sgl_moe.offload.engine import read_ids
from sgl_moe.streaming.gpu_timing import gpu_test_device
from sgl_moe.streaming.moe_math import _use_grouped
from sgl_moe.streaming.moe_stack import MoEStackConfig

DEVICE = gpu_test_device()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")]
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA streams, events and sync counting")
FULL = DEVICE == "cuda"  # the CPU dry run checks this file's code on fewer cases
LAYERS = 4
RESIDENT = {0: [1, 5], 2: [0, 3, 7], 3: [6]}


def _cfg(dtype: str) -> MoEStackConfig:
    return MoEStackConfig(hidden=128, heads=4, kv_heads=2, head_dim=32, experts=16, top_k=4, expert_width=64,
                          layers=LAYERS, dtype=dtype)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def stack(request):
    return DecodeStack(_cfg(request.param), DEVICE, context=64, seed=3)


def _same(out: torch.Tensor, ref: torch.Tensor) -> None:
    if out.dtype == torch.float32:
        assert torch.equal(out, ref)
    else:
        rel = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert rel < 1e-2, rel


def _steps(stack, batch, hit, n=3):
    out = []
    for s in range(n):
        x = stack.token_inputs(batch, seed=s)
        ref, ids = stack.step(x)
        out.append((x, ref, ids, synthetic_predictions(ids, [hit] * LAYERS, stack.cfg.experts, seed=10 * batch + s)))
    return out


@pytest.mark.parametrize("execution", ["on_demand", "exact"])
@pytest.mark.parametrize("batch", [1, 4] if FULL else [4])
@pytest.mark.parametrize("resident", [None, RESIDENT], ids=["no-resident", "resident"])
@pytest.mark.parametrize("hit", [0.0, 0.5, 1.0] if FULL else [0.5])
def test_decode_equals_resident(stack, execution, batch, resident, hit):
    engine = OffloadEngine(stack.store(), OffloadConfig(execution=execution), DEVICE, resident=resident)
    try:
        for x, ref, ids, pred in _steps(stack, batch, hit):
            out, got = stack.step(x, engine, predicted=pred)
            _same(out, ref)
            assert all(torch.equal(a, b) for a, b in zip(got, ids))
        assert engine.stats.acquires == 3 * LAYERS
    finally:
        engine.close()


@pytest.mark.parametrize("batch", [1, 4])
def test_speculative(stack, batch):
    engine = OffloadEngine(stack.store(), OffloadConfig(execution="speculative"), DEVICE, resident=RESIDENT)
    try:
        for x, ref, _ids, pred in _steps(stack, batch, hit=1.0):
            _same(stack.step(x, engine, predicted=pred, speculative=True)[0], ref)
        for x, _ref, _ids, pred in _steps(stack, batch, hit=0.3):
            expected, _ = stack.step(x, None, predicted=pred, speculative=True)
            _same(stack.step(x, engine, predicted=pred, speculative=True)[0], expected)
    finally:
        engine.close()


def test_read_ids_on_the_device():
    a = torch.tensor([[3, 1], [0, 7]], device=DEVICE)
    b = torch.tensor([[2, 5, 9]], dtype=torch.int32, device=DEVICE)
    ha, hb = read_ids(a, b)
    assert ha.device.type == hb.device.type == "cpu"
    assert ha.tolist() == [[3, 1], [0, 7]] and hb.tolist() == [[2, 5, 9]]


@cuda_only
@pytest.mark.parametrize("execution", ["on_demand", "exact", "speculative"])
def test_one_sync_per_layer(execution):
    from sgl_moe.streaming.gpu_timing import count_syncs

    stack = DecodeStack(_cfg("bfloat16"), DEVICE, context=64, seed=3)
    x = stack.token_inputs(4, seed=0)
    if not _use_grouped(x):
        pytest.skip("no grouped GEMM for bf16 here: the per-expert loop adds one host read per layer by design")
    _ref, ids = stack.step(x)
    pred = synthetic_predictions(ids, [0.5] * LAYERS, stack.cfg.experts, seed=1)
    n_ref, _ = count_syncs(lambda: stack.step(x))
    assert n_ref == 0, f"{n_ref} synchronizing calls in a resident decode step"
    engine = OffloadEngine(stack.store(), OffloadConfig(execution=execution), DEVICE)
    try:
        spec = execution == "speculative"
        stack.step(x, engine, predicted=pred, speculative=spec)  # warm
        n, _ = count_syncs(lambda: stack.step(x, engine, predicted=pred, speculative=spec))
        assert n == LAYERS, f"{n} synchronizing calls in a decode step of {LAYERS} layers (want one per layer)"
    finally:
        engine.close()


@cuda_only
def test_prefetch_copy_runs_inside_the_compute_window(monkeypatch):
    from sgl_moe.streaming.gpu_timing import ComputeLoad, event, time_cuda

    cfg = MoEStackConfig(hidden=1024, experts=32, expert_width=512, top_k=4, layers=2, dtype="bfloat16")
    stack = DecodeStack(cfg, DEVICE, context=16)
    store = stack.store(pin=True)
    engine = OffloadEngine(store, OffloadConfig(execution="exact"), DEVICE)
    experts = list(range(0, 32, 2))  # 16 experts of layer 1: ~50 MB
    dst = [torch.empty_like(store[1].w13[0], device=DEVICE) for _ in experts]
    copy_s = time_cuda(lambda: engine_module.gather_rows(dst, [store[1].w13[e] for e in experts]), reps=5)
    copy_s *= 1.5  # w13 and w2 rows (w2 is half of w13)
    load = ComputeLoad(torch.device(DEVICE))
    compute_s = time_cuda(lambda: load.issue(4 * copy_s), reps=3, warmup=1)
    marks = []
    original = engine_module.gather_rows

    def timed(d, s):  # on the copy lane's stream
        marks.append(event())
        original(d, s)
        marks.append(event())

    monkeypatch.setattr(engine_module, "gather_rows", timed)
    try:
        engine.acquire(0, torch.tensor([[0, 1, 2, 3]], device=DEVICE), host_ids=torch.tensor([[0, 1, 2, 3]]))
        marks.clear()
        start = event()
        engine.prefetch(1, torch.tensor([experts]))
        load.issue(4 * copy_s)  # layer 0's experts and layer 1's attention
        end = event()
        engine.release(0)
        torch.cuda.synchronize()
        assert len(marks) == 2, "the prefetch should be one batched copy"
        copy_start, copy_end = marks
        assert start.elapsed_time(copy_end) > 0, "the prefetch ended before the compute started"
        assert copy_end.elapsed_time(end) > 0, "the prefetch did not end inside the compute window"
        assert copy_start.elapsed_time(copy_end) > 0
        window_s = start.elapsed_time(end) / 1e3
        assert window_s < compute_s + 0.5 * copy_s, (window_s, compute_s, copy_s)
    finally:
        engine.close()
