"""The weight streamer on CPU: same outputs as resident weights, slots reused without allocation, a slow
copy never exposes a stale layer, timing hooks, refusals."""

from __future__ import annotations

import pytest
import torch

from sgl_moe.streaming import StreamConfig, StreamConfigError, WeightStreamer, lanes
from sgl_moe.streaming.moe_stack import MoEStack, MoEStackConfig

LAYERS = 5


@pytest.fixture(scope="module")
def model():
    return MoEStack(MoEStackConfig.tiny(layers=LAYERS), "cpu", seed=11)


@pytest.fixture(scope="module")
def x(model):
    return model.inputs(2, 16)


@pytest.fixture(scope="module")
def reference(model, x):
    return model.forward(x, WeightStreamer(model.store(), StreamConfig(mode="off"), "cpu"))


@pytest.mark.parametrize("mode", ["host", "on_demand"])
@pytest.mark.parametrize("window", [1, 2, 3, 8])
def test_streamed_forward_equals_resident(model, x, reference, mode, window):
    s = WeightStreamer(model.store(), StreamConfig(mode=mode, window=window), "cpu")
    try:
        for _ in range(3):  # later forwards run on slots refilled cyclically by earlier ones
            assert torch.equal(model.forward(x, s), reference)
        assert s.stats.restarts == 0
    finally:
        s.close()


def test_slots_are_reused_without_allocation(model, x):
    s = WeightStreamer(model.store(), StreamConfig(mode="host", window=2), "cpu")
    try:
        ptrs = {id(slot): (slot.w13.data_ptr(), slot.w2.data_ptr()) for slot in s._slots}
        seen = set()
        for _ in range(3):
            for layer in range(LAYERS):
                w = s.acquire(layer)
                seen.add((w.w13.data_ptr(), w.w2.data_ptr()))
                s.release(layer)
        resident = {(w.w13.data_ptr(), w.w2.data_ptr()) for w in s._resident.values()}
        assert seen == set(ptrs.values()) | resident  # only the window's buffers and the resident layer
        assert {id(slot): (slot.w13.data_ptr(), slot.w2.data_ptr()) for slot in s._slots} == ptrs
        # Expert memory: resident first layer + window.
        assert s.device_expert_bytes() == 3 * model.store().layer_bytes
    finally:
        s.close()


def test_slow_copy_never_exposes_a_stale_layer(model, x, reference):
    """Every copy sleeps 200 ms before writing: the compute (well under a millisecond per tiny layer) runs far
    ahead of the copies and must wait for them; outputs stay exact."""
    s = WeightStreamer(model.store(), StreamConfig(mode="host", window=2, timing=True), "cpu", copy_delay_s=0.2)
    try:
        for _ in range(2):
            assert torch.equal(model.forward(x, s), reference)
            timings = s.layer_timings()
            assert [t.layer for t in timings] == list(range(LAYERS))
            # Copies are serialized on one lane, 200 ms each: at least one streamed layer waited for its copy
            # (which layer depends on how fast this machine computes, so no per-layer timing is asserted).
            assert max(t.wait_s for t in timings[1:]) > 0.05
    finally:
        s.close()


def test_the_stale_slot_test_can_fail(model, x, reference, monkeypatch):
    """Negative control: if acquire did not wait for its fence, the slow copy would leave stale weights.
    (The delay must outlast layer 0's compute on a loaded 2-core machine: 30 ms was seen to flake.)"""
    monkeypatch.setattr(lanes.ThreadFence, "wait", lambda self: None)
    s = WeightStreamer(model.store(), StreamConfig(mode="host", window=2), "cpu", copy_delay_s=0.3)
    try:
        assert not torch.equal(model.forward(x, s), reference)
    finally:
        monkeypatch.undo()
        s.close()


def test_out_of_order_acquire_rebuilds_the_window(model, x):
    s = WeightStreamer(model.store(), StreamConfig(mode="host", window=2), "cpu")
    try:
        w = s.acquire(3)  # not the next expected layer
        assert torch.equal(w.w13, model.store()[3].w13)
        s.release(3)
        assert s.stats.restarts == 1
        w = s.acquire(4)
        assert torch.equal(w.w13, model.store()[4].w13)
        s.release(4)
    finally:
        s.close()


def test_copy_failure_surfaces_at_acquire(model):
    store = model.store()
    s = WeightStreamer(store, StreamConfig(mode="on_demand"), "cpu")
    try:
        s.store = None  # on_demand copies at acquire: the copy fails there and surfaces to the caller
        with pytest.raises(TypeError):
            s.acquire(1)
    finally:
        s.store = store


@pytest.mark.parametrize("cfg,world,message", [
    (StreamConfig(mode="gather"), 1, "needs"),
    (StreamConfig(mode="host", window=0), 1, "at least 1"),
    (StreamConfig(mode="bogus"), 1, "unknown"),  # type: ignore[arg-type]
])
def test_config_refusals(cfg, world, message):
    with pytest.raises(StreamConfigError, match=message):
        cfg.validate(num_layers=4, world_size=world)


def test_gather_without_process_group_is_refused(model):
    with pytest.raises(StreamConfigError, match="torch.distributed"):
        WeightStreamer(model.store(), StreamConfig(mode="gather"), "cpu")
