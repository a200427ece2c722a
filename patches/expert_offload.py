"""SGLang adapter for CPU expert offload with next-layer prediction (seed 003): hooks only.

The engine (``sgl_moe.offload``) and the predictor (``sgl_moe.prediction``) are plain torch; this module wires
them into SGLang's MoE layers:

- after ``ModelRunner.load_model``: the experts move into the host store of the AsyncEP streaming patch (the
  same store serves both paths), an ``OffloadEngine`` is built on it, and each MoE block's ``forward`` is
  wrapped to remember the post-attention residual r_l of the forward (the predictor's input);
- around ``FusedMoE.run_moe_core``: a forward with few tokens (decode: tokens x top-k < experts) runs on the
  engine's double buffer, with SGLang's own MoE kernel reading the buffer and the routed ids remapped to buffer
  slots; it predicts layer l+1's experts from r_l and layer l's routing and prefetches them while layer l
  computes. A forward with many tokens (prefill) goes to the streaming patch (whole layers).

Execution ``exact`` runs the router's experts (SGLang's output); ``speculative`` runs the predicted experts with
the predicted weights from layer 1 on (layer 0 has no prediction) in decode steps only — a prefill, short or
long, always runs its true experts, so prompt logprobs and the first token are SGLang's; ``on_demand`` copies
the routed experts after routing (no prediction: the baseline).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch

from sgl_moe.offload.config import OffloadConfig
from sgl_moe.offload.engine import OffloadEngine, read_ids
from sgl_moe.offload.resident import choose_resident
from sgl_moe.patches import expert_streaming, runtime_env
from sgl_moe.patches.runtime_env import RuntimeConfig
from sgl_moe.prediction.bundle import PredictorBundle, find_bundle
from sgl_moe.prediction.predictor import NextLayerPredictor
from sgl_moe.wire import OFFLOAD_STATS_FILE

log = logging.getLogger("sgl_moe.patches.offload")

LOAD_MODEL = expert_streaming.LOAD_MODEL
RUN_MOE_CORE = expert_streaming.RUN_MOE_CORE

STATS_FILE = OFFLOAD_STATS_FILE  # the HTTP process reads it for /sgl_moe/info


class OffloadPatchError(RuntimeError):
    """The loaded model cannot be served with expert offload (layout, missing predictor bundle...)."""


def _blocks(model: torch.nn.Module, experts: list) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    """(decoder layer, sparse MoE block) of each FusedMoE layer, in layer order (Qwen3-MoE / Mixtral layout)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise OffloadPatchError("--moe-expert-offload supports decoder stacks at model.model.layers")
    found = []
    for m in experts:
        layer = layers[m.layer_id]
        block = next((getattr(layer, n) for n in ("mlp", "block_sparse_moe") if getattr(getattr(layer, n, None),
                                                                                       "experts", None) is m), None)
        norm = getattr(layer, "post_attention_layernorm", None)
        if block is None or norm is None or not hasattr(getattr(block, "gate", None), "weight"):
            raise OffloadPatchError(f"--moe-expert-offload: layer {m.layer_id} is not a (gate, experts) MoE block "
                                    "after a post_attention_layernorm (Qwen3-MoE / Mixtral layout)")
        found.append((layer, block))
    return found


class OffloadedExperts:
    """Per model runner: the engine, the predictor and the state of the current forward."""

    def __init__(self, engine: OffloadEngine, streamed, predictor: NextLayerPredictor | None, execution: str,
                 num_experts: int, top_k: int, stats_path: str | None) -> None:
        self.engine = engine
        self.streamed = streamed  # the AsyncEP patch's StreamedExperts: prefill forwards
        self.predictor = predictor
        self.execution = execution
        self.num_experts = num_experts
        self.top_k = top_k
        self.last = engine.num_layers - 1
        self.stats_path = stats_path
        self._decode = False
        self._residual: dict[int, torch.Tensor] = {}
        self._predicted: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._counts = {"decode_forwards": 0, "stream_forwards": 0, "hits_after_layer0": 0, "misses_after_layer0": 0}
        """Forwards by path; hits and misses of layers >= 1 in decode steps (the live prediction hit rate)."""
        self._written = 0.0
        self._warned = False
        self._decode_mode = False

    def is_decode(self, tokens: int) -> bool:
        """Few tokens: per-expert copies pay; many (tokens x k >= E, nearly every expert active): whole layers."""
        return 0 < tokens and tokens * self.top_k < self.num_experts

    def remember_residual(self, index: int, forward_batch) -> None:
        if index == 0:  # speculation is for decode steps; a short prefill runs its true experts
            mode = getattr(forward_batch, "forward_mode", None)
            self._decode_mode = mode is not None and mode.is_decode()
        stream = getattr(forward_batch, "residual_stream", None)
        residual = getattr(stream, "residual", None)
        if residual is not None and getattr(stream, "pending", None) is None:
            self._residual[index] = residual

    def run(self, layer, index: int, original, args, kwargs):
        dispatch = kwargs["dispatch_output"] if "dispatch_output" in kwargs else args[0]
        if index == 0:
            self._decode = self.is_decode(int(dispatch.hidden_states.shape[0]))
            self._predicted.clear()
            self._counts["decode_forwards" if self._decode else "stream_forwards"] += 1
        if not self._decode:
            self._residual.pop(index, None)
            try:
                return self.streamed.run(layer, index, original, args, kwargs)
            finally:
                if index == self.last:
                    self._write_stats()
        topk = dispatch.topk_output
        weights, ids = topk.topk_weights, topk.topk_ids
        if self.execution == "speculative" and self._decode_mode and index in self._predicted:
            weights, ids = self._predicted.pop(index)
        residual = self._residual.pop(index, None)
        predicted = None
        if self.predictor is not None and index < self.last and residual is None:
            # SGLang left the residual pending (e.g. a reduction still owed under tensor parallelism): nothing
            # to predict from. Layer l+1 then loads what it routes (a miss), in either execution.
            if not self._warned:
                log.warning("layer %d: no post-attention residual to predict from; layer %d loads on demand",
                            index, index + 1)
                self._warned = True
        elif self.predictor is not None and index < self.last:
            # d_l uses layer l's own routing (its router always runs; seed 003 Algorithm 1, line 7). The ids go
            # to the host before acquire: after it the compute stream waits on the copy, and a read would block.
            p_weights, p_ids = self.predictor.predict(index, residual, topk.topk_weights, topk.topk_ids)
            predicted = (p_weights, p_ids)
            self._predicted[index + 1] = (p_weights, p_ids)
        # One device->host read per layer: the ids acquire maps and the predicted ids, in one copy.
        host_ids, p_host = read_ids(ids, predicted[1]) if predicted is not None else (read_ids(ids)[0], None)
        misses, hits = self.engine.stats.misses, self.engine.stats.hits
        buffer, slots = self.engine.acquire(index, ids, host_ids=host_ids)
        if index > 0 and self._decode_mode:  # decode steps; layer 0 has nothing predicted, loads what it routes
            self._counts["misses_after_layer0"] += self.engine.stats.misses - misses
            self._counts["hits_after_layer0"] += self.engine.stats.hits - hits
        if p_host is not None:
            self.engine.prefetch(index + 1, p_host)
        layer.w13_weight.data = buffer.w13
        layer.w2_weight.data = buffer.w2
        routed = type(topk)(weights.to(topk.topk_weights.dtype), slots.to(topk.topk_ids.dtype), topk.router_logits)
        dispatch = dispatch._replace(topk_output=routed)
        args = args[1:] if "dispatch_output" not in kwargs else args
        kwargs = {**kwargs, "dispatch_output": dispatch}
        try:
            return original(layer, *args, **kwargs)
        finally:
            self.engine.release(index)
            if index == self.last:
                self._write_stats()

    def stats(self) -> dict:
        out: dict = self.engine.stats.as_dict()
        out.update(self._counts, execution=self.execution,
                   predictor=self.predictor.kind if self.predictor is not None else None,
                   device_expert_bytes=self.engine.device_expert_bytes())
        return out

    def _write_stats(self) -> None:
        now = time.monotonic()
        if self.stats_path is None or now - self._written < 1.0:
            return
        self._written = now
        tmp = f"{self.stats_path}.tmp"
        Path(tmp).write_text(json.dumps(self.stats()))
        os.replace(tmp, self.stats_path)


def _wrap_block_forward(block, index: int, offloaded: OffloadedExperts) -> None:
    """Remember r_l (the residual after attention) before the block runs; the block itself is unchanged."""
    if getattr(block, "_sgl_moe_wrapped", False):
        return
    inner = block.forward

    def forward(hidden_states, forward_batch=None, *args, **kwargs):
        if forward_batch is not None:
            offloaded.remember_residual(index, forward_batch)
        return inner(hidden_states, forward_batch, *args, **kwargs)

    block.forward = forward
    block._sgl_moe_wrapped = True


def _predictor(bundle: PredictorBundle | None, blocks, kind: str, top_k: int, renormalize: bool,
               model_path: str) -> NextLayerPredictor:
    if bundle is None:
        raise OffloadPatchError(f"--moe-expert-offload: no expert_predictor bundle for {model_path}; train one with "
                                f"`python -m sgl_moe.prediction.train --model {model_path}`")
    gates = [block.gate.weight.data for _, block in blocks]
    norms = [layer.post_attention_layernorm.weight.data for layer, _ in blocks]
    eps = float(getattr(blocks[0][0].post_attention_layernorm, "variance_epsilon", 1e-6))
    try:
        return NextLayerPredictor(bundle, gates, norms, eps, top_k, kind, renormalize=renormalize)
    except ValueError as exc:
        raise OffloadPatchError(f"--moe-predictor {kind}: {exc}") from None


def install(model_runner, cfg: RuntimeConfig) -> OffloadedExperts:
    """Host store + streamer (the AsyncEP patch), then the offload engine and predictor on the same store."""
    streamed = expert_streaming.install(model_runner, cfg)
    experts = expert_streaming.moe_layers(model_runner.model)
    first = experts[0]
    if hasattr(first, "_sgl_moe_offloaded"):
        return first._sgl_moe_offloaded
    blocks = _blocks(model_runner.model, experts)
    num_experts, top_k = int(first.num_experts), int(first.top_k)
    model_path = model_runner.server_args.model_path
    bundle_dir = find_bundle(model_path)
    bundle = PredictorBundle.load(bundle_dir) if bundle_dir is not None else None
    predictor = None
    if cfg.moe.execution != "on_demand":
        topk_config = getattr(getattr(blocks[0][1], "topk", None), "topk_config", None)
        if topk_config is not None and (topk_config.use_grouped_topk or topk_config.custom_routing_function
                                        or topk_config.correction_bias is not None):
            raise OffloadPatchError("--moe-expert-offload predicts plain softmax top-k routing; this model's "
                                    "router is grouped, biased or custom (use --moe-execution on_demand)")
        renormalize = bool(getattr(topk_config, "renormalize", True))
        predictor = _predictor(bundle, blocks, cfg.moe.predictor, top_k, renormalize, model_path)
    resident = None
    if cfg.moe.resident_experts:
        if bundle is None or getattr(bundle, "frequencies", None) is None:
            raise OffloadPatchError("--moe-resident-experts picks the most routed experts from the predictor "
                                    "bundle's activation counts, which this bundle lacks; retrain it")
        resident = choose_resident(bundle.frequencies, min(cfg.moe.resident_experts, num_experts))
    store = streamed.streamer.store
    engine = OffloadEngine(store, OffloadConfig(execution=cfg.moe.execution), first.w13_weight.device, resident)
    stats_path = os.path.join(cfg.profile_dir, STATS_FILE) if cfg.profile_dir else None
    offloaded = OffloadedExperts(engine, streamed, predictor, cfg.moe.execution, num_experts, top_k, stats_path)
    for i, (m, (_, block)) in enumerate(zip(experts, blocks)):
        m._sgl_moe_offloaded = offloaded
        _wrap_block_forward(block, i, offloaded)
    log.info("expert offload: %d MoE layers x %d experts (top-%d), execution %s, predictor %s, %d resident "
             "experts per layer; forwards with tokens x %d >= %d stream whole layers; %.1f MB of experts in "
             "offload buffers", len(experts), num_experts, top_k, cfg.moe.execution,
             cfg.moe.predictor if predictor is not None else "none", cfg.moe.resident_experts, top_k, num_experts,
             engine.device_expert_bytes() / 1e6)
    return offloaded


def around_run_moe_core(original, layer, *args, **kwargs):
    offloaded = getattr(layer, "_sgl_moe_offloaded", None)
    if offloaded is None:
        return expert_streaming.around_run_moe_core(original, layer, *args, **kwargs)
    return offloaded.run(layer, layer._sgl_moe_index, original, args, kwargs)


def after_load_model(result, model_runner, *args, **kwargs):
    cfg = runtime_env.current()
    if cfg is not None and cfg.moe.expert_offload:
        install(model_runner, cfg)
    return result
