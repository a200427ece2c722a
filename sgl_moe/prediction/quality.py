"""Prediction quality on held-out text (seed 003 Figs 3, 4, 9, 10 and Table 1, for one model on CPU).

    python -m sgl_moe.prediction.quality --model sgl_moe/models/tiny-qwen3-moe \
        --json benchmarks/results/offload/tiny-prediction-quality.json

1. per target layer l+1: recall@k of router / estimator / hybrid prediction (and of the router on s_l,
   the no-default-vector baseline); cosine similarity of q_l and of s_l to the true router input s_{l+1}
2. mean held-out estimator recall vs training tokens (fresh estimators; the bundle's default vectors)
3. speculative execution: every layer >= 1 runs the *predicted* experts with the predicted weights, the
   prediction made in the same forward from layer l's residual and layer l's own router output
   (seed 003 Algorithm 1); next-token agreement and KL(exact ‖ speculative) against exact execution
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sgl_moe.prediction.activations import Activations, ModelView, collect, load_model, router_input_of, token_windows
from sgl_moe.prediction.bundle import PredictorBundle, find_bundle
from sgl_moe.prediction.estimator import EstimatorConfig
from sgl_moe.prediction.predictor import KINDS, NextLayerPredictor
from sgl_moe.prediction.signals import recall_at_k, router_predict
from sgl_moe.prediction.train import TrainArgs, fit_estimator, log, quasi_states, recall_table
from sgl_moe.streaming.moe_math import route


@dataclass(frozen=True)
class QualityArgs:
    model: str = ""
    """Model directory; its expert_predictor/ bundle is evaluated unless --bundle is given."""
    bundle: str = ""
    json: str = ""
    """Write the results here as JSON (empty: print only)."""
    heldout_tokens: int = 65_536
    speculative_tokens: int = 32_768
    """Held-out tokens for the speculative-execution runs (one forward per kind plus one exact)."""
    hit_rate_tokens: str = "10000,30000,100000,300000"
    """Training-token counts for the hit-rate curve (comma separated; empty skips it)."""
    min_steps: int = 1500
    """Optimizer steps at least, for the small training sets of the hit-rate curve."""
    window: int = 512
    seed: int = 0
    threads: int = 2


def _kinds(bundle: PredictorBundle) -> list[str]:
    return [kind for kind in KINDS if bundle.estimator is not None or kind == "router"]


def make_predictor(view: ModelView, bundle: PredictorBundle, kind: str) -> NextLayerPredictor:
    return NextLayerPredictor(bundle, view.gate_weights, view.norm_weights, view.eps, view.top_k, kind,  # type: ignore[arg-type]
                              view.renormalize)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.float(), b.float(), dim=-1).mean().item()


@torch.no_grad()
def per_layer(held: Activations, view: ModelView, bundle: PredictorBundle) -> list[dict[str, Any]]:
    """Recall@k per kind through NextLayerPredictor, the s_l baseline and the two cosine similarities."""
    predictors = {kind: make_predictor(view, bundle, kind) for kind in _kinds(bundle)}
    q = quasi_states(held, view, bundle.defaults)
    rows = []
    for l in range(view.num_layers - 1):
        w, ids = route(held.router_logits[l], view.top_k, view.renormalize)
        _, true_ids = route(held.router_logits[l + 1], view.top_k, view.renormalize)
        s_l, s_next = router_input_of(held, view, l), router_input_of(held, view, l + 1)
        row: dict[str, Any] = {"layer": l + 1}
        for kind, pred in predictors.items():
            _, p_ids = pred.predict(l, held.residual[l], w, ids)
            row[kind] = round(recall_at_k(p_ids, true_ids).mean().item(), 4)
        _, s_ids = router_predict(s_l, view.gate_weights[l + 1], view.top_k, view.renormalize)
        row["router_on_s"] = round(recall_at_k(s_ids, true_ids).mean().item(), 4)
        row["cos_q"] = round(_cos(q[l], s_next), 4)
        row["cos_s"] = round(_cos(s_l, s_next), 4)
        row["uses_estimator"] = row["layer"] in bundle.hybrid_layers
        rows.append(row)
    return rows


def hit_rate_vs_tokens(model, view: ModelView, bundle: PredictorBundle, held: Activations, counts: list[int],
                       args: QualityArgs) -> list[dict[str, Any]]:
    """Fresh estimators on the first n training tokens (prefixes of one window stream)."""
    windows = token_windows(args.model, "train", max(counts), args.window, args.seed)
    acts = collect(model, windows, log_every=25)
    q = quasi_states(acts, view, bundle.defaults)
    cfg = bundle.estimator_config or EstimatorConfig(hidden=view.hidden, num_layers=view.num_layers - 1,
                                                     num_experts=view.num_experts)
    base = TrainArgs(**bundle.facts.get("args", {})) if bundle.facts.get("args") else TrainArgs()
    rows = []
    for n in counts:
        n = min(n, acts.num_tokens)
        samples = (view.num_layers - 1) * n
        epochs = max(base.epochs, math.ceil(args.min_steps * base.batch_size / samples))
        t0 = time.time()
        est = fit_estimator(q[:, :n], acts.router_logits[1:, :n], cfg, replace(base, epochs=epochs, seed=args.seed))
        table = recall_table(held, view, bundle.defaults, est)
        mean = sum(r["estimator"] for r in table) / len(table)
        rows.append({"train_tokens": n, "epochs": epochs, "estimator_mean_recall": round(mean, 4),
                     "per_layer": [r["estimator"] for r in table], "fit_seconds": round(time.time() - t0, 1)})
        log(f"hit rate with {n} training tokens: {mean:.4f}")
    return rows


@contextmanager
def speculative_routing(model, predictor: NextLayerPredictor) -> Iterator[None]:
    """Layers >= 1 execute the experts predicted at the layer before, with the predicted weights.

    Wraps HF's router outputs with forward hooks (transformers itself is untouched): each layer's gate
    still computes its true routing, which feeds the default vector of the next prediction.
    """
    layers = model.model.layers
    residual: dict[int, torch.Tensor] = {}
    pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def hooks_for(l: int, layer):
        def pre_norm(_mod, args):
            residual[l] = args[0].reshape(-1, args[0].shape[-1])

        def gate(_mod, _args, out):
            logits, w, ids = out
            if l + 1 < len(layers):
                pending[l + 1] = predictor.predict(l, residual.pop(l), w, ids)
            if l == 0:
                return out
            p_w, p_ids = pending.pop(l)
            return logits, p_w.to(w.dtype), p_ids.to(ids.dtype)

        return [layer.post_attention_layernorm.register_forward_pre_hook(pre_norm),
                layer.mlp.gate.register_forward_hook(gate)]

    handles = [h for l, layer in enumerate(layers) for h in hooks_for(l, layer)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def speculative(model, view: ModelView, bundle: PredictorBundle, windows: torch.Tensor,
                batch_windows: int = 8) -> list[dict[str, Any]]:
    predictors = {kind: make_predictor(view, bundle, kind) for kind in _kinds(bundle)}
    agree = {k: 0 for k in predictors}
    kl = {k: 0.0 for k in predictors}
    tokens = 0
    for b in range(0, windows.shape[0], batch_windows):
        batch = windows[b:b + batch_windows]
        exact = F.log_softmax(model(input_ids=batch, use_cache=False).logits.float(), -1)
        for kind, predictor in predictors.items():
            with speculative_routing(model, predictor):
                spec = F.log_softmax(model(input_ids=batch, use_cache=False).logits.float(), -1)
            agree[kind] += (exact.argmax(-1) == spec.argmax(-1)).sum().item()
            kl[kind] += F.kl_div(spec, exact, log_target=True, reduction="sum").item()
        tokens += batch.numel()
    return [{"kind": k, "top1_agreement": round(agree[k] / tokens, 4), "kl_mean": round(kl[k] / tokens, 5),
             "tokens": tokens} for k in predictors]


def markdown(result: dict[str, Any]) -> str:
    lines = ["| target layer | router | estimator | hybrid | router on s_l | cos(q_l, s_l+1) | cos(s_l, s_l+1) |",
             "|---|---|---|---|---|---|---|"]
    for r in result["per_layer"]:
        mark = " *" if r["uses_estimator"] else ""
        lines.append(f"| {r['layer']}{mark} | {r['router']:.3f} | {r.get('estimator', float('nan')):.3f} | "
                     f"{r.get('hybrid', r['router']):.3f} | {r['router_on_s']:.3f} | {r['cos_q']:.3f} | "
                     f"{r['cos_s']:.3f} |")
    m = result["mean"]
    lines.append(f"| mean | {m['router']:.3f} | {m.get('estimator', float('nan')):.3f} | "
                 f"{m.get('hybrid', m['router']):.3f} | {m['router_on_s']:.3f} | | |")
    lines += ["", "(* = hybrid uses the estimator)", "", "| train tokens | estimator mean recall |", "|---|---|"]
    lines += [f"| {r['train_tokens']} | {r['estimator_mean_recall']:.3f} |" for r in result["hit_rate_vs_tokens"]]
    lines += ["", "| speculative kind | next-token agreement | KL(exact ‖ spec) / token |", "|---|---|---|"]
    lines += [f"| {r['kind']} | {r['top1_agreement']:.4f} | {r['kl_mean']:.5f} |" for r in result["speculative"]]
    return "\n".join(lines)


def evaluate(args: QualityArgs) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    t0 = time.time()
    bundle_dir = Path(args.bundle) if args.bundle else find_bundle(args.model)
    if bundle_dir is None:
        raise SystemExit(f"no expert_predictor/ bundle under {args.model}; run python -m sgl_moe.prediction.train")
    bundle = PredictorBundle.load(bundle_dir)
    model = load_model(args.model)
    view = ModelView.of(model)
    held_windows = token_windows(args.model, "heldout", args.heldout_tokens, args.window, args.seed)
    held = collect(model, held_windows, with_router_input=True)
    rows = per_layer(held, view, bundle)
    mean = {k: round(sum(r[k] for r in rows) / len(rows), 4)
            for k in ("router", "estimator", "hybrid", "router_on_s") if k in rows[0]}
    log(f"per-layer recall done ({time.time() - t0:.0f} s)")
    n_spec = max(1, args.speculative_tokens // args.window)
    spec = speculative(model, view, bundle, held_windows[:n_spec])
    log(f"speculative execution done ({time.time() - t0:.0f} s)")
    counts = [int(x) for x in args.hit_rate_tokens.split(",") if x.strip()]
    curve = hit_rate_vs_tokens(model, view, bundle, held, counts, args) if counts else []
    return {"model": Path(args.model).name, "device": "cpu", "threads": args.threads, "top_k": view.top_k,
            "heldout_tokens": held.num_tokens, "bundle": {"hybrid_layers": sorted(bundle.hybrid_layers),
                                                          **{k: v for k, v in bundle.facts.items() if k != "args"}},
            "per_layer": rows, "mean": mean, "hit_rate_vs_tokens": curve, "speculative": spec,
            "seconds": round(time.time() - t0, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sgl_moe.prediction.quality", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in fields(QualityArgs):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                            required=f.name == "model")
    ns = parser.parse_args(argv)
    args = QualityArgs(**{f.name: getattr(ns, f.name) for f in fields(QualityArgs)})
    result = evaluate(args)
    print(markdown(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
