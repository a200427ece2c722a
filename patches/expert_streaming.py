"""Patch: SGLang's FusedMoE layers take their expert weights from the AsyncEP ``WeightStreamer``.

Two hooks, registered by the plugin only when ``--moe-weight-streaming`` is not ``off``:
- after ``ModelRunner.load_model``: the experts of every FusedMoE layer move into an ``ExpertStore`` (pinned
  host memory on a GPU, freeing their device memory before SGLang sizes its KV pool) and a streamer is
  attached to the layers;
- around ``FusedMoE.run_moe_core``: ``acquire`` the layer's slot, point the layer's weight parameters at it,
  run SGLang's own MoE kernel, ``release``.
While the worker has not been calibrated, per-layer timing is on and the first forward of the requested
size is written out as the profile (``profile_handshake``); timing then turns off.
"""

from __future__ import annotations

import logging

import torch

from sgl_moe.patches import profile_handshake, runtime_env
from sgl_moe.patches.runtime_env import RuntimeConfig
from sgl_moe.streaming import ExpertStore, LayerWeights, StreamConfig, WeightStreamer

log = logging.getLogger("sgl_moe.patches.expert_streaming")

RUN_MOE_CORE = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.run_moe_core"
LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


class StreamingPatchError(RuntimeError):
    """The loaded model cannot be streamed (quantized experts, expert parallelism...)."""


class StreamedExperts:
    """The streamer of one model runner and the profile of its calibration forward."""

    def __init__(self, streamer: WeightStreamer, profile_dir: str | None) -> None:
        self.streamer = streamer
        self.last = streamer.num_layers - 1
        self.profile_dir = profile_dir
        self._armed = False
        self._tokens = 0

    def run(self, layer, index: int, original, args, kwargs):
        s = self.streamer
        if index == 0 and s.timer is not None:
            s.timer.reset()  # keep only the current forward's marks
            want = profile_handshake.requested_tokens(self.profile_dir) if self.profile_dir else None
            dispatch_output = kwargs.get("dispatch_output", args[0] if args else None)
            self._tokens = int(dispatch_output.hidden_states.shape[0]) if dispatch_output is not None else 0
            self._armed = want is not None and self._tokens >= want
        w = s.acquire(index)
        layer.w13_weight.data = w.w13
        layer.w2_weight.data = w.w2
        try:
            return original(layer, *args, **kwargs)
        finally:
            s.release(index)
            if index == self.last and self._armed:
                self._write_profile()

    def _write_profile(self) -> None:
        timings = self.streamer.layer_timings()
        self.streamer.timer = None  # calibrated: steady-state serving pays nothing for timing
        self._armed = False
        layers = [{"layer": t.layer, "wall_s": t.wall_s, "wait_s": t.wait_s} for t in timings]
        profile_handshake.write_profile(self.profile_dir, self._tokens, layers)
        log.info("calibration profile: %d tokens, per-layer ms %s (waits %s)", self._tokens,
                 [round(t.wall_s * 1e3, 2) for t in timings], [round(t.wait_s * 1e3, 2) for t in timings])


def moe_layers(model: torch.nn.Module) -> list:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    return sorted((m for m in model.modules() if isinstance(m, FusedMoE)), key=lambda m: m.layer_id)


def check_streamable(layers: list) -> None:
    if not layers:
        raise StreamingPatchError("--moe-weight-streaming: the model has no FusedMoE layers to stream")
    for m in layers:
        method = type(m.quant_method).__name__
        if method != "UnquantizedFusedMoEMethod" or not hasattr(m, "w13_weight") or not hasattr(m, "w2_weight"):
            raise StreamingPatchError(f"--moe-weight-streaming supports unquantized expert weights; layer "
                                      f"{m.layer_id} uses {method}")
        if getattr(m, "moe_ep_size", 1) > 1:
            raise StreamingPatchError("--moe-weight-streaming host streams every expert of a layer to each rank; "
                                      "it cannot be combined with expert parallelism (--ep-size > 1)")


def install(model_runner, cfg: RuntimeConfig) -> StreamedExperts:
    """Move the experts of ``model_runner.model`` into a store and attach a streamer (idempotent)."""
    layers = moe_layers(model_runner.model)
    if layers and hasattr(layers[0], "_sgl_moe_streamed"):
        return layers[0]._sgl_moe_streamed
    check_streamable(layers)
    device = layers[0].w13_weight.device
    weights = [LayerWeights(m.w13_weight.data, m.w2_weight.data) for m in layers]
    store = ExpertStore.to_host(weights, pin=True)
    if device.type == "cuda":
        for m in layers:  # the store holds the only copy now; the device keeps just the window
            m.w13_weight.data = torch.empty(0, dtype=m.w13_weight.dtype, device=device)
            m.w2_weight.data = torch.empty(0, dtype=m.w2_weight.dtype, device=device)
        torch.cuda.empty_cache()
    streamer = WeightStreamer(store, StreamConfig(mode=cfg.weight_streaming, window=cfg.moe.stream_window,  # type: ignore[arg-type]
                                                  timing=cfg.profile_dir is not None), device)
    streamed = StreamedExperts(streamer, cfg.profile_dir)
    for i, m in enumerate(layers):
        m._sgl_moe_streamed = streamed
        m._sgl_moe_index = i
    log.info("expert weight streaming (%s, window %d): %d MoE layers, %.1f MB each in the host store, %.1f MB of "
             "experts on %s", cfg.weight_streaming, streamer.window, len(layers), store.layer_bytes / 1e6,
             streamer.device_expert_bytes() / 1e6, device)
    return streamed


def around_run_moe_core(original, layer, *args, **kwargs):
    streamed = getattr(layer, "_sgl_moe_streamed", None)
    if streamed is None:
        return original(layer, *args, **kwargs)
    return streamed.run(layer, layer._sgl_moe_index, original, args, kwargs)


def after_load_model(result, model_runner, *args, **kwargs):
    cfg = runtime_env.current()
    if cfg is not None and cfg.weight_streaming != "off":
        install(model_runner, cfg)
    return result
