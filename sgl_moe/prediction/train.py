"""Build the expert-predictor bundle for a Qwen3-MoE model (CPU, minutes for the tiny model).

    python -m sgl_moe.prediction.train --model sgl_moe/models/tiny-qwen3-moe

Steps: capture activations on training windows -> default vectors -> quasi-hidden states q_l ->
distil the estimator (KL(router_{l+1} ‖ estimator(q_l, l)), AdamW) -> held-out recall@k per target layer
for router and estimator -> hybrid layers -> save ``<model>/expert_predictor/``.

Hybrid layers: target layers whose held-out router recall is below ``--hybrid-threshold`` (0.8: the seed's
Qwen3 router prediction reaches about 0.9 beyond the early layers, so 0.8 marks the layers that drift)
and where the estimator's recall is higher.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from sgl_moe.prediction.activations import Activations, ModelView, collect, load_model, token_windows
from sgl_moe.prediction.bundle import BUNDLE_DIRNAME, PredictorBundle
from sgl_moe.prediction.estimator import EstimatorConfig, ExpertEstimator, distillation_loss
from sgl_moe.prediction.signals import DefaultVectors, quasi_hidden, recall_at_k, router_predict
from sgl_moe.streaming.moe_math import route


@dataclass(frozen=True)
class TrainArgs:
    model: str = ""
    """Model directory (HF format)."""
    out: str = ""
    """Bundle directory; empty: <model>/expert_predictor."""
    train_tokens: int = 300_000
    """Training tokens for default vectors and the estimator (about 2.5 minutes in all on 2 CPU cores)."""
    heldout_tokens: int = 65_536
    """Held-out tokens for the recall table."""
    window: int = 512
    """Tokens per forward window (the model's training length)."""
    seed: int = 0
    hybrid_threshold: float = 0.8
    """Router recall below which a target layer may use the estimator (if it does better there)."""
    latent: int = 128
    mlp: int = 256
    epochs: int = 4
    batch_size: int = 2048
    lr: float = 3e-3
    weight_decay: float = 0.01
    threads: int = 2


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def quasi_states(acts: Activations, view: ModelView, defaults: DefaultVectors) -> torch.Tensor:
    """q_l for every source layer l = 0..L-2: [L-1, T, H], from r_l and layer l's true routing."""
    qs = []
    for l in range(view.num_layers - 1):
        w, ids = route(acts.router_logits[l], view.top_k, view.renormalize)
        d = defaults.layer_default(l, w, ids)
        qs.append(quasi_hidden(acts.residual[l], d, view.norm_weights[l + 1], view.eps))
    return torch.stack(qs)


def fit_estimator(q: torch.Tensor, teacher: torch.Tensor, cfg: EstimatorConfig, args: TrainArgs) -> ExpertEstimator:
    """Distil the estimator: q [S, T, H] (S source layers), teacher logits of layer l+1 [S, T, E]."""
    torch.manual_seed(args.seed)
    est = ExpertEstimator(cfg)
    S, T, H = q.shape
    x = q.reshape(S * T, H)
    y = teacher.reshape(S * T, -1)
    layer_of = torch.arange(S).repeat_interleave(T)
    steps_per_epoch = max(1, (S * T) // args.batch_size)
    total = steps_per_epoch * args.epochs
    opt = torch.optim.AdamW(est.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    # Warm-up then cosine decay; at least 4 scheduled steps and 2 of warm-up (OneCycleLR divides by both).
    sched_steps = max(total, 4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=sched_steps,
                                                pct_start=max(0.05, 2 / sched_steps), final_div_factor=20)
    gen = torch.Generator().manual_seed(args.seed)
    step = 0
    for epoch in range(args.epochs):
        order = torch.randperm(S * T, generator=gen)
        running = 0.0
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            loss = distillation_loss(est(x[idx], layer_of[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            running += loss.item()
        if (epoch + 1) % max(1, args.epochs // 8) == 0 or epoch + 1 == args.epochs:
            log(f"  estimator epoch {epoch + 1}/{args.epochs}: mean KL {running / steps_per_epoch:.4f} ({step} steps)")
    return est.eval().requires_grad_(False)


@torch.no_grad()
def recall_table(acts: Activations, view: ModelView, defaults: DefaultVectors,
                 estimator: ExpertEstimator | None) -> list[dict[str, Any]]:
    """Held-out recall@k by target layer l+1 for the router and the estimator on q_l."""
    q = quasi_states(acts, view, defaults)
    rows = []
    for l in range(view.num_layers - 1):
        _, true_ids = route(acts.router_logits[l + 1], view.top_k, view.renormalize)
        _, r_ids = router_predict(q[l], view.gate_weights[l + 1], view.top_k, view.renormalize)
        row: dict[str, Any] = {"layer": l + 1, "router": round(recall_at_k(r_ids, true_ids).mean().item(), 4)}
        if estimator is not None:
            _, e_ids = route(estimator(q[l], l), view.top_k, view.renormalize)
            row["estimator"] = round(recall_at_k(e_ids, true_ids).mean().item(), 4)
        rows.append(row)
    return rows


def choose_hybrid(recall: list[dict[str, Any]], threshold: float) -> frozenset[int]:
    """Target layers where the router is below threshold and the estimator beats it."""
    return frozenset(r["layer"] for r in recall
                     if "estimator" in r and r["router"] < threshold and r["estimator"] > r["router"])


def build(args: TrainArgs, model=None) -> PredictorBundle:
    """Everything but saving; ``model`` may be passed in to skip loading it again."""
    torch.set_num_threads(args.threads)
    t0 = time.time()
    model = model if model is not None else load_model(args.model)
    view = ModelView.of(model)
    train_windows = token_windows(args.model, "train", args.train_tokens, args.window, args.seed)
    held_windows = token_windows(args.model, "heldout", args.heldout_tokens, args.window, args.seed)
    log(f"windows: {train_windows.numel()} train tokens, {held_windows.numel()} held-out tokens "
        f"({time.time() - t0:.0f} s)")
    acts = collect(model, train_windows, with_defaults=True, log_every=25)
    assert acts.defaults is not None
    t_collect = time.time()
    log(f"train activations captured ({t_collect - t0:.0f} s)")
    q = quasi_states(acts, view, acts.defaults)
    cfg = EstimatorConfig(hidden=view.hidden, latent=args.latent, mlp=args.mlp,
                          num_layers=view.num_layers - 1, num_experts=view.num_experts)
    estimator = fit_estimator(q, acts.router_logits[1:], cfg, args)
    t_fit = time.time()
    log(f"estimator trained: {estimator.num_parameters()} parameters ({t_fit - t_collect:.0f} s)")
    del q
    held = collect(model, held_windows)
    recall = recall_table(held, view, acts.defaults, estimator)
    hybrid = choose_hybrid(recall, args.hybrid_threshold)
    for row in recall:
        row["hybrid"] = row["estimator"] if row["layer"] in hybrid else row["router"]
        log(f"  layer {row['layer']}: router {row['router']:.3f}  estimator {row['estimator']:.3f}"
            f"{'  (hybrid: estimator)' if row['layer'] in hybrid else ''}")
    facts = {"model": Path(args.model).name, "train_tokens": train_windows.numel(),
             "heldout_tokens": held_windows.numel(), "top_k": view.top_k, "num_layers": view.num_layers,
             "num_experts": view.num_experts, "hidden": view.hidden,
             "estimator_parameters": estimator.num_parameters(), "args": asdict(replace(args, model="", out="")),
             "collect_seconds": round(t_collect - t0, 1), "fit_seconds": round(t_fit - t_collect, 1),
             "total_seconds": round(time.time() - t0, 1)}
    return PredictorBundle(defaults=acts.defaults, estimator=estimator, estimator_config=cfg, hybrid_layers=hybrid,
                           recall=recall, facts=facts)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    for f in fields(TrainArgs):
        default = f.default
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=default,
                            required=f.name == "model")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sgl_moe.prediction.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    ns = parser.parse_args(argv)
    args = TrainArgs(**{f.name: getattr(ns, f.name) for f in fields(TrainArgs)})
    bundle = build(args)
    out = Path(args.out) if args.out else Path(args.model) / BUNDLE_DIRNAME
    bundle.save(out)
    log(f"saved {out} (hybrid layers {sorted(bundle.hybrid_layers)}, {bundle.facts['total_seconds']} s)")


if __name__ == "__main__":
    main()
