"""The offload engine on CPU: on_demand and exact decode equal resident experts exactly, speculative equals
its reference, counts add up, buffers are allocated once, and a slow copy is waited for (with a negative
control showing the test can fail)."""

from __future__ import annotations

import pytest
import torch

from sgl_moe.offload import OffloadCapacityError, OffloadConfig, OffloadConfigError, OffloadEngine
from sgl_moe.offload.decode_stack import DecodeStack, synthetic_predictions
from sgl_moe.offload.engine import read_ids
from sgl_moe.streaming import lanes
from sgl_moe.streaming.moe_stack import MoEStackConfig

LAYERS = 4
STEPS = 3
RESIDENT = {0: [1, 5], 2: [0, 3, 7], 3: [6]}


@pytest.fixture(scope="module")
def stack():
    return DecodeStack(MoEStackConfig.tiny(layers=LAYERS), "cpu", context=32, seed=3)


@pytest.fixture(scope="module")
def store(stack):
    return stack.store()


def _steps(stack, batch, hit):
    """Per step: input, resident output, true ids per layer, synthetic predictions at hit rate ``hit``."""
    out = []
    for s in range(STEPS):
        x = stack.token_inputs(batch, seed=s)
        ref, ids = stack.step(x)
        pred = synthetic_predictions(ids, [hit] * LAYERS, stack.cfg.experts, seed=100 * batch + s)
        out.append((x, ref, ids, pred))
    return out


def _needed(ids_per_layer, resident):
    """Distinct non-resident experts needed, summed over layers."""
    return sum(len(set(t.reshape(-1).tolist()) - set(resident.get(layer, [])))
               for layer, t in enumerate(ids_per_layer))


@pytest.mark.parametrize("execution", ["on_demand", "exact"])
@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("resident", [None, RESIDENT], ids=["no-resident", "resident"])
@pytest.mark.parametrize("hit", [0.0, 0.5, 1.0])
def test_decode_equals_resident(stack, store, execution, batch, resident, hit):
    engine = OffloadEngine(store, OffloadConfig(execution=execution), "cpu", resident=resident)
    res = resident or {}
    needed = layer0 = 0
    try:
        for x, ref, ids, pred in _steps(stack, batch, hit):
            out, got_ids = stack.step(x, engine, predicted=pred)
            assert torch.equal(out, ref)
            assert all(torch.equal(a, b) for a, b in zip(got_ids, ids))
            needed += _needed(ids, res)
            layer0 += _needed(ids[:1], res)
        st = engine.stats
        assert st.acquires == STEPS * LAYERS
        assert st.hits + st.misses == needed
        assert st.bytes_moved == st.experts_copied * engine.expert_bytes
        assert st.experts_copied == st.prefetched + st.misses
        if execution == "on_demand":
            assert st.prefetched == 0 and st.hits == 0
        elif hit == 1.0:
            assert st.misses == layer0  # perfect predictions: only layer 0's cold start misses
        if resident:
            assert st.resident_hits > 0 and st.d2d_experts == st.resident_hits
    finally:
        engine.close()


@pytest.mark.parametrize("batch", [1, 4])
def test_speculative_with_perfect_predictions_equals_exact(stack, store, batch):
    engine = OffloadEngine(store, OffloadConfig(execution="speculative"), "cpu", resident=RESIDENT)
    try:
        for x, ref, _ids, pred in _steps(stack, batch, hit=1.0):
            out, _ = stack.step(x, engine, predicted=pred, speculative=True)
            assert torch.equal(out, ref)
    finally:
        engine.close()


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_speculative_with_wrong_predictions_equals_its_reference(stack, store, batch):
    """Predicted experts and weights run on offloaded weights = the same run on resident weights; no
    misses after layer 0."""
    engine = OffloadEngine(store, OffloadConfig(execution="speculative"), "cpu")
    layer0 = 0
    try:
        for x, ref, _ids, pred in _steps(stack, batch, hit=0.3):
            expected, _ = stack.step(x, None, predicted=pred, speculative=True)
            out, got_ids = stack.step(x, engine, predicted=pred, speculative=True)
            assert torch.equal(out, expected)
            assert not torch.equal(out, ref)
            layer0 += _needed(got_ids[:1], {})
        assert engine.stats.misses == layer0
    finally:
        engine.close()


def test_buffers_are_allocated_once(stack, store):
    engine = OffloadEngine(store, OffloadConfig(execution="exact", capacity=6), "cpu")
    ptrs = [(b.weights.w13.data_ptr(), b.weights.w2.data_ptr()) for b in engine._buffers]
    seen = set()
    try:
        for _x, _ref, ids, pred in _steps(stack, 2, hit=0.5):
            for layer in range(LAYERS):
                w, slots = engine.acquire(layer, ids[layer])
                assert w.num_experts == 6 and slots.shape == ids[layer].shape and slots.dtype == ids[layer].dtype
                assert torch.equal(w.w13[slots], store[layer].w13[ids[layer]])
                seen.add((w.w13.data_ptr(), w.w2.data_ptr()))
                if layer + 1 < LAYERS:
                    engine.prefetch(layer + 1, pred[layer + 1])
                engine.release(layer)
        assert seen == set(ptrs)
        assert [(b.weights.w13.data_ptr(), b.weights.w2.data_ptr()) for b in engine._buffers] == ptrs
        assert engine.device_expert_bytes() == 2 * 6 * engine.expert_bytes
    finally:
        engine.close()


@pytest.mark.parametrize("capacity", [2, 3])
def test_small_capacity_evicts_mispredictions_and_stays_exact(stack, store, capacity):
    engine = OffloadEngine(store, OffloadConfig(execution="exact", capacity=capacity), "cpu")
    try:
        for x, ref, _ids, pred in _steps(stack, 1, hit=0.5):  # batch 1, top-2: two experts per layer
            assert torch.equal(stack.step(x, engine, predicted=pred)[0], ref)
    finally:
        engine.close()


def test_capacity_overflow_is_a_clear_error(stack, store):
    engine = OffloadEngine(store, OffloadConfig(execution="exact", capacity=2), "cpu")
    try:
        with pytest.raises(OffloadCapacityError, match="needs 4 distinct experts at once but a buffer has 2 slots"):
            engine.acquire(0, torch.tensor([[0, 1], [2, 3]]))
    finally:
        engine.close()


def test_slow_copy_is_waited_for(stack, store):
    """Every copy sleeps 50 ms first: acquire must wait for it; outputs stay exact."""
    engine = OffloadEngine(store, OffloadConfig(execution="exact", timing=True), "cpu", copy_delay_s=0.05)
    try:
        for x, ref, _ids, pred in _steps(stack, 2, hit=0.5)[:2]:
            assert torch.equal(stack.step(x, engine, predicted=pred)[0], ref)
            timings = engine.layer_timings()
            assert [t.layer for t in timings] == list(range(LAYERS))
            assert max(t.wait_s for t in timings) > 0.03
    finally:
        engine.close()


def test_the_slow_copy_test_can_fail(stack, store, monkeypatch):
    """Negative control: with the fence wait bypassed, compute reads slots the slow copy has not filled."""
    monkeypatch.setattr(lanes.ThreadFence, "wait", lambda self: None)
    # The delay must outlast a layer's compute on a loaded 2-core machine (30 ms can flake there).
    engine = OffloadEngine(store, OffloadConfig(execution="exact"), "cpu", copy_delay_s=0.3)
    try:
        x, ref, ids, pred = _steps(stack, 2, hit=0.5)[0]
        assert not torch.equal(stack.step(x, engine, predicted=pred)[0], ref)
    finally:
        monkeypatch.undo()
        engine.close()


@pytest.mark.parametrize("cfg,message", [
    (OffloadConfig(execution="bogus"), "unknown offload execution 'bogus'"),  # type: ignore[arg-type]
    (OffloadConfig(capacity=0), "between 1 and the 8 experts"),
    (OffloadConfig(capacity=9), "between 1 and the 8 experts"),
])
def test_config_refusals(cfg, message):
    with pytest.raises(OffloadConfigError, match=message):
        cfg.validate(num_experts=8)


def test_bad_resident_sets_are_refused(store):
    with pytest.raises(ValueError, match="layer 9"):
        OffloadEngine(store, OffloadConfig(), "cpu", resident={9: [0]})
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        OffloadEngine(store, OffloadConfig(), "cpu", resident={0: [8]})


def test_prefetch_past_the_last_layer_and_on_demand_prefetch_are_no_ops(store):
    for execution in ("exact", "on_demand"):
        engine = OffloadEngine(store, OffloadConfig(execution=execution), "cpu")
        try:
            engine.prefetch(LAYERS, torch.tensor([[0, 1]]))
            if execution == "on_demand":
                engine.prefetch(1, torch.tensor([[0, 1]]))
            assert engine.stats.prefetched == 0
        finally:
            engine.close()


def test_read_ids_is_one_copy_and_acquire_takes_host_ids(stack, store):
    """read_ids passes host tensors through (the device path: test_gpu_offload); acquire with host_ids = without."""
    a, b = torch.tensor([[3, 1], [0, 7]]), torch.tensor([[2, 5]], dtype=torch.int32)
    ra, rb = read_ids(a, b)
    assert ra is a and rb is b
    engines = [OffloadEngine(store, OffloadConfig(execution="exact", capacity=5), "cpu") for _ in range(2)]
    try:
        for layer in range(LAYERS):
            ids = torch.tensor([[layer, 7 - layer], [1, 6]])
            w0, s0 = engines[0].acquire(layer, ids)
            w1, s1 = engines[1].acquire(layer, ids, host_ids=ids.clone())
            assert torch.equal(s0, s1) and torch.equal(w0.w13[s0], w1.w13[s1])
            assert torch.equal(w1.w13[s1], store[layer].w13[ids])
            for e in engines:
                e.release(layer)
        assert engines[0].stats.as_dict() == engines[1].stats.as_dict()
    finally:
        for e in engines:
            e.close()
