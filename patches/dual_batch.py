"""SGLang adapter for dual micro-batch attention–MoE overlap (``--moe-dual-batch``): hooks only.

The engine (``sgl_moe.overlap``: split, solver, ``DualBatchRunner``) is plain torch. Here, around the MoE
model's forward (``Qwen2MoeModel.forward``, which Qwen3-MoE inherits), a *decode* forward of at least two
sequences is run by the runner over ``SGLangDecodeLayers``: SGLang's own modules (input norm, attention with
SGLang's KV cache, post-attention norm, gate) on each micro-batch's rows, and the routed experts from the
FusedMoE weights, with the split and order from the solver. Everything else (prefill, one sequence, a plan
that says overlap does not pay) runs SGLang's forward untouched.

Attention of a micro-batch needs that micro-batch's attention metadata. SGLang's torch-native backend
(the CPU path) keeps none between calls: it reads the request indices, sequence lengths and cache locations
from the forward batch, so a shallow copy with those rows sliced serves one micro-batch. Backends that plan
per batch (flashinfer, FA3, triton) would need one child backend per micro-batch (what SGLang's own TBO
builds); the launcher refuses them for now.

Costs are measured, not assumed: the first ``CALIBRATION_FORWARDS`` eligible forwards run SGLang's path and
time layer 0's attention and experts alone on the batch (samples for ``CostModel.fit``) and one half's
attention beside the other half's experts on the runner's lanes (the overlap efficiency η: two streams of one
GPU overlap far less than a GPU and a CPU); then the solver plans every new batch shape (cached by shape).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sgl_moe.overlap.costs import CostModel, Sample
from sgl_moe.overlap.engine import DualBatchRunner
from sgl_moe.overlap.layers import LayerOps
from sgl_moe.overlap.solver import Plan, Solver
from sgl_moe.patches import runtime_env
from sgl_moe.patches.runtime_env import RuntimeConfig
from sgl_moe.streaming.expert_store import LayerWeights
from sgl_moe.streaming.moe_math import experts_forward, route
from sgl_moe.wire import DUAL_BATCH_STATS_FILE

log = logging.getLogger("sgl_moe.patches.dual_batch")

LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
MODEL_FORWARD = "sglang.srt.models.qwen2_moe.Qwen2MoeModel.forward"
CALIBRATION_FORWARDS = 6

_SLICED = ("input_ids", "positions", "req_pool_indices", "seq_lens", "seq_lens_cpu", "out_cache_loc")


class DualBatchPatchError(RuntimeError):
    """The loaded model cannot run dual micro-batches (layout, attention backend...)."""


@dataclass(frozen=True)
class _Shape:
    layers: int
    hidden: int
    top_k: int


class SGLangDecodeLayers(LayerOps):
    """The runner's view of an SGLang Qwen2/3-MoE decoder stack during one decode forward."""

    def __init__(self, model: torch.nn.Module, placement: str = "streams") -> None:
        super().__init__()
        self.model = model
        self.layers = list(model.layers)
        first = self.layers[0].mlp
        self.cfg = _Shape(len(self.layers), int(model.config.hidden_size), int(first.topk.topk_config.top_k))
        self.renormalize = bool(first.topk.topk_config.renormalize)
        self.device = first.experts.w13_weight.device
        self.dense = self.layers
        # The CPU worker reads host weights. On a GPU, cpu-experts keeps a host copy of the experts for the
        # decode micro-batches; the device copy stays for prefill (no device memory is saved in this version).
        to_host = placement == "cpu-experts" and self.device.type != "cpu"
        self._host_experts = [LayerWeights(*(w.data.to("cpu") if to_host else w.data
                                             for w in (l.mlp.experts.w13_weight, l.mlp.experts.w2_weight)))
                              for l in self.layers]
        if to_host:
            gib = sum(w.w13.nbytes + w.w2.nbytes for w in self._host_experts) / 2**30
            log.info("dual micro-batch (cpu-experts): host copy of the routed experts, %.2f GiB", gib)
        self.forward_batch = None
        self.positions: torch.Tensor | None = None
        self._subs: dict[tuple[int, int], object] = {}

    def bind(self, forward_batch, positions: torch.Tensor) -> None:
        self.forward_batch, self.positions, self._subs = forward_batch, positions, {}

    def _sub(self, rows: slice):
        """A shallow copy of the forward batch holding only ``rows`` (decode: one token per sequence)."""
        key = (rows.start, rows.stop)
        if key not in self._subs:
            fb = self.forward_batch
            sub = copy.copy(fb)
            for name in _SLICED:
                value = getattr(fb, name, None)
                if value is not None:
                    setattr(sub, name, value[rows])
            sub.batch_size = rows.stop - rows.start
            if getattr(fb, "seq_lens_sum", None) is not None and fb.seq_lens_cpu is not None:
                sub.seq_lens_sum = int(sub.seq_lens_cpu.sum())
            self._subs[key] = sub
        return self._subs[key]

    def attend(self, layer: int, x: torch.Tensor, rows: slice) -> torch.Tensor:
        block = self.layers[layer]
        assert self.positions is not None
        h = block.input_layernorm(x)
        return x + block.self_attn(positions=self.positions[rows], hidden_states=h, forward_batch=self._sub(rows))

    def route(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        block = self.layers[layer]
        h = block.post_attention_layernorm(x)
        logits, _ = block.mlp.gate(h)
        weights, ids = route(logits, self.cfg.top_k, self.renormalize)
        return h, weights, ids

    def work(self, rows: slice) -> tuple[int, int]:
        seq = self.forward_batch.seq_lens_cpu[rows]
        return int(seq.numel()), int(seq.sum())

    @property
    def batch(self) -> int:
        return int(self.forward_batch.batch_size)


class DualBatch:
    """Per model: the ops, the runner, the measured cost model and the solver."""

    def __init__(self, model: torch.nn.Module, placement: str, always: bool = False,
                 stats_path: str | None = None) -> None:
        self.ops = SGLangDecodeLayers(model, placement)
        self.placement = placement
        self.always = always
        self.runner = DualBatchRunner(self.ops, placement)  # type: ignore[arg-type]
        self.samples: list[Sample] = []
        self.etas: list[float] = []
        self.eta: float | None = None
        self.solver: Solver | None = None
        self.counts = {"overlapped": 0, "not_overlapped": 0, "calibration": 0, "failed": 0}
        self.disabled = False
        self.stats_path = stats_path
        self._written = 0.0
        self._last_plan: dict | None = None

    def stats(self) -> dict:
        """Counts of decode forwards by path, the cost model, the solver's work and its latest new plan."""
        solver = self.solver
        return {**self.counts, "placement": self.placement, "disabled": self.disabled,
                "cost_model": asdict(solver.model) if solver is not None else None, "eta": self.eta,
                "shapes_solved": solver.solves if solver is not None else 0, "last_new_plan": self._last_plan}

    def _write_stats(self, force: bool = False) -> None:
        """For ``/sgl_moe/info`` (the HTTP process): at most once a second, or now on a first event."""
        now = time.monotonic()
        if self.stats_path is None or (not force and now - self._written < 1.0):
            return
        self._written = now
        tmp = f"{self.stats_path}.tmp"
        Path(tmp).write_text(json.dumps(self.stats()))
        os.replace(tmp, self.stats_path)

    @staticmethod
    def eligible(forward_batch, input_embeds) -> bool:
        mode = forward_batch.forward_mode
        return input_embeds is None and mode.is_decode() and int(forward_batch.batch_size) >= 2

    def plan(self) -> Plan:
        assert self.solver is not None
        contexts = self.ops.forward_batch.seq_lens_cpu.tolist()
        solves = self.solver.solves
        plan = self.solver.plan([1] * len(contexts), contexts)
        if self.solver.solves != solves:  # a new batch shape: say what was decided and why
            a, b = plan.split.rows()
            self._last_plan = {"sequences": len(contexts), "overlap": plan.overlap, "split": [a.stop - a.start,
                               b.stop - b.start], "order": plan.order, "predicted_ms": plan.predicted_makespan * 1e3,
                               "predicted_sequential_ms": plan.predicted_sequential * 1e3, "bound": plan.bound}
            log.info("dual micro-batch plan for %d sequences (contexts %d..%d): %s; split %d/%d, order %s, "
                     "predicted %.3f ms vs %.3f ms sequential (bound %.0f%%)%s", len(contexts), min(contexts),
                     max(contexts), "overlap" if plan.overlap else "no overlap", a.stop - a.start, b.stop - b.start,
                     plan.order, plan.predicted_makespan * 1e3, plan.predicted_sequential * 1e3, plan.bound * 100,
                     f": {plan.reason}" if plan.reason else "")
        return plan

    def calibrate(self, x: torch.Tensor) -> None:
        """Time layer 0's attention and experts on this batch, alone (the forward itself runs SGLang's path)."""
        rows = slice(0, x.shape[0])
        tokens, nc = self.ops.work(rows)
        sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        a = self.ops.attend(0, x, rows)
        h, w, ids = self.ops.route(0, a)
        if self.runner.expert_device != x.device:  # cpu-experts on a GPU: the copy is the attention task's
            h, w, ids = (t.to(self.runner.expert_device) for t in (h, w, ids))
        sync()
        t2 = time.perf_counter()
        experts_forward(h, w, ids, self.runner.weights[0])
        sync()
        t3 = time.perf_counter()
        self.samples += [Sample("attention", tokens, nc, t2 - t0), Sample("moe", tokens, 0, t3 - t2)]
        half = x.shape[0] // 2
        if half:  # how much of the shorter task hides when one half's attention runs beside the other's MoE
            self.etas.append(self.runner.overlap_efficiency(slice(0, half), slice(half, x.shape[0]), reps=1, x=x))
        self.counts["calibration"] += 1
        if self.counts["calibration"] >= CALIBRATION_FORWARDS:
            model = CostModel.fit(self.samples)
            self.eta = statistics.median(self.etas) if self.etas else 1.0
            self.solver = Solver(model, self.ops.cfg.layers, self.placement,  # type: ignore[arg-type]
                                 eta=self.eta, force_overlap=self.always)
            log.info("dual micro-batch (%s): cost model from %d forwards: %s; overlap efficiency eta %.2f",
                     self.placement, self.counts["calibration"], model, self.eta)
            self._write_stats(force=True)

    def forward(self, model, input_ids, positions, forward_batch) -> torch.Tensor | None:
        """The decode forward through the runner, or None to let SGLang run it (calibration, no gain)."""
        self.ops.bind(forward_batch, positions)
        if self.solver is None:
            # The calibration's attention writes this step's K/V into SGLang's cache, which SGLang's own
            # forward then writes again with the same values: harmless, and done a handful of times.
            self.calibrate(model.embed_tokens(input_ids))
            return None
        plan = self.plan()
        key = "overlapped" if plan.overlap else "not_overlapped"
        self.counts[key] += 1
        self._write_stats(force=self.counts[key] == 1)
        if not plan.overlap:
            return None
        x = model.embed_tokens(input_ids)
        try:
            out = self.runner.run(x, plan)
        except Exception as exc:  # a bug or an unsupported batch: serve it (and the rest) through SGLang's path
            self.disabled = True
            self.counts["failed"] += 1
            self.runner.close()  # drains the lanes: nothing of the failed run is still running
            log.error("dual micro-batch overlap failed (%r); this worker runs SGLang's forward from now on", exc,
                      exc_info=True)
            self._write_stats(force=True)
            return None
        return model.norm(out)


def install(model_runner, cfg: RuntimeConfig) -> DualBatch:
    model = getattr(model_runner.model, "model", None)
    layers = getattr(model, "layers", None)
    if layers is None or not all(hasattr(getattr(l, "mlp", None), "experts") for l in layers):
        raise DualBatchPatchError("--moe-dual-batch supports Qwen2/3-MoE decoder stacks with an MoE block in "
                                  "every layer")
    existing = getattr(model, "_sgl_moe_dual", None)
    if existing is not None:
        return existing
    stats_path = os.path.join(cfg.profile_dir, DUAL_BATCH_STATS_FILE) if cfg.profile_dir else None
    dual = DualBatch(model, cfg.moe.dual_batch, cfg.moe.dual_batch_always, stats_path)
    model._sgl_moe_dual = dual
    log.info("dual micro-batch attention-MoE overlap (%s): %d layers; decode forwards of >= 2 sequences, "
             "after %d calibration forwards", cfg.moe.dual_batch, len(layers), CALIBRATION_FORWARDS)
    return dual


def around_model_forward(original, model, input_ids, positions, forward_batch, input_embeds=None, *args, **kwargs):
    dual = getattr(model, "_sgl_moe_dual", None)
    if (dual is not None and not dual.disabled and not args and not kwargs.get("pp_proxy_tensors")
            and dual.eligible(forward_batch, input_embeds)):
        out = dual.forward(model, input_ids, positions, forward_batch)
        if out is not None:
            return out
    return original(model, input_ids, positions, forward_batch, input_embeds, *args, **kwargs)


def after_load_model(result, model_runner, *args, **kwargs):
    cfg = runtime_env.current()
    if cfg is not None and cfg.moe.dual_batch != "off":
        install(model_runner, cfg)
    return result
