"""Offline activation capture from the HF reference model, for default vectors, training and evaluation.

Shapes: N windows of W tokens, T = N·W tokens, L layers, H hidden, E experts, k experts per token.

Per decoder layer l (HF ``Qwen3MoeDecoderLayer``) forward hooks record
    r_l  the post-attention residual: the input of ``post_attention_layernorm`` (hidden + attention)
    s_l  the router input: the output of ``post_attention_layernorm`` (only when asked: r_l gives it back)
    the true router logits: the first output of ``mlp.gate``
and, for default vectors, sum each expert's *unweighted* FFN output over the tokens routed to it.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from sgl_moe.prediction.signals import DefaultVectors, rms_norm

Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class ModelView:
    """What prediction reads from a Qwen3-MoE model: each layer's gate and router-input norm."""

    gate_weights: list[torch.Tensor]
    """Per layer, the router weight [E, H]."""
    norm_weights: list[torch.Tensor]
    """Per layer, the ``post_attention_layernorm`` weight [H] (the norm that feeds the router)."""
    eps: float
    top_k: int
    renormalize: bool

    @property
    def num_layers(self) -> int:
        return len(self.gate_weights)

    @property
    def num_experts(self) -> int:
        return self.gate_weights[0].shape[0]

    @property
    def hidden(self) -> int:
        return self.gate_weights[0].shape[1]

    @classmethod
    def of(cls, model) -> ModelView:
        layers = model.model.layers
        cfg = model.config
        return cls(gate_weights=[layer.mlp.gate.weight.detach().float() for layer in layers],
                   norm_weights=[layer.post_attention_layernorm.weight.detach().float() for layer in layers],
                   eps=float(cfg.rms_norm_eps), top_k=int(cfg.num_experts_per_tok),
                   renormalize=bool(cfg.norm_topk_prob))


@dataclass
class Activations:
    """Captured per-layer tensors for T tokens (fp32, on CPU)."""

    residual: torch.Tensor
    """[L, T, H] post-attention residual r_l."""
    router_logits: torch.Tensor
    """[L, T, E] true router logits."""
    router_input: torch.Tensor | None
    """[L, T, H] s_l, when captured."""
    defaults: DefaultVectors | None
    """Default vectors from these tokens, when asked for."""

    @property
    def num_tokens(self) -> int:
        return self.residual.shape[1]


def load_model(model_dir: Path | str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval().requires_grad_(False)


def token_windows(model_dir: Path | str, split: Split, num_tokens: int, window: int = 512,
                  seed: int = 0) -> torch.Tensor:
    """Non-overlapping windows [N, W] (N = num_tokens // W, at least 1) from the corpus split.

    Documents are shuffled with ``seed`` first (the corpus is sorted by path), tokenized as in the
    model's training (each followed by EOS) and concatenated; only as many as needed are tokenized.
    """
    from tokenizers import Tokenizer

    from sgl_moe.training.corpus import load_corpus, tokenize_docs

    corpus = load_corpus()
    docs = list(corpus.train if split == "train" else corpus.heldout)
    random.Random(seed).shuffle(docs)
    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    eos_id = 2
    n_windows = max(1, num_tokens // window)
    stream: list[int] = []
    for start in range(0, len(docs), 64):
        stream.extend(tokenize_docs(tokenizer, docs[start:start + 64], eos_id))
        if len(stream) >= n_windows * window:
            break
    n_windows = min(n_windows, len(stream) // window)
    if n_windows == 0:
        raise ValueError(f"the {split} split holds fewer than {window} tokens")
    return torch.tensor(stream[:n_windows * window], dtype=torch.long).view(n_windows, window)


def _expert_outputs_sum(x: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                        sums: torch.Tensor, counts: torch.Tensor) -> None:
    """Add each expert's unweighted output over its routed rows of x [T, H] into sums [E, H], counts [E]."""
    for e in torch.unique(ids).tolist():
        rows = (ids == e).any(-1).nonzero().squeeze(-1)
        gate, up = F.linear(x[rows], gate_up[e]).chunk(2, dim=-1)
        out = F.linear(F.silu(gate) * up, down[e])  # [n, H]
        sums[e] += out.sum(0, dtype=torch.float64)
        counts[e] += rows.numel()


@torch.no_grad()
def collect(model, windows: torch.Tensor, batch_windows: int = 8, with_defaults: bool = False,
            with_router_input: bool = False, log_every: int = 0) -> Activations:
    """Run the model over windows [N, W] and capture every layer's r_l, router logits (and s_l, defaults)."""
    view = ModelView.of(model)
    layers = model.model.layers
    L, E, H = view.num_layers, view.num_experts, view.hidden
    T = windows.numel()
    residual = torch.empty(L, T, H)
    logits = torch.empty(L, T, E)
    router_input = torch.empty(L, T, H) if with_router_input else None
    sums = torch.zeros(L, E, H, dtype=torch.float64)
    counts = torch.zeros(L, E, dtype=torch.long)
    cursor = [0, 0]  # token offset and count of the current batch

    def hooks_for(l: int, layer):
        def pre_norm(_mod, args):
            r = args[0].reshape(-1, H)
            residual[l, cursor[0]:cursor[0] + cursor[1]] = r.float()

        def post_norm(_mod, _args, out):
            if router_input is not None:
                router_input[l, cursor[0]:cursor[0] + cursor[1]] = out.reshape(-1, H).float()

        def gate(_mod, args, out):
            logits[l, cursor[0]:cursor[0] + cursor[1]] = out[0].float()
            if with_defaults:
                x = args[0].reshape(-1, H)
                _expert_outputs_sum(x, out[2], layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj,
                                    sums[l], counts[l])

        return [layer.post_attention_layernorm.register_forward_pre_hook(pre_norm),
                layer.post_attention_layernorm.register_forward_hook(post_norm),
                layer.mlp.gate.register_forward_hook(gate)]

    handles = [h for l, layer in enumerate(layers) for h in hooks_for(l, layer)]
    try:
        for b in range(0, windows.shape[0], batch_windows):
            batch = windows[b:b + batch_windows]
            cursor[1] = batch.numel()
            model(input_ids=batch, use_cache=False)
            cursor[0] += cursor[1]
            if log_every and (b // batch_windows) % log_every == 0:
                print(f"  activations: {cursor[0]}/{T} tokens", file=sys.stderr, flush=True)
    finally:
        for h in handles:
            h.remove()
    return Activations(residual=residual, router_logits=logits, router_input=router_input,
                       defaults=DefaultVectors.from_sums(sums, counts) if with_defaults else None)


def router_input_of(acts: Activations, view: ModelView, layer: int) -> torch.Tensor:
    """s_l [T, H]: captured if available, else RMSNorm_l(r_l) (the same arithmetic in fp32)."""
    if acts.router_input is not None:
        return acts.router_input[layer]
    return rms_norm(acts.residual[layer], view.norm_weights[layer], view.eps)
