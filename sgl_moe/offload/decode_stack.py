"""A decode model for the offload benchmark and tests: MoE layers shaped by ``MoEStackConfig``, random
weights (bf16 on a GPU, the config's dtype on a CPU), B sequences decoding one token each over a random KV
cache of ``context`` tokens. No SGLang.

Per layer: RMSNorm → QKV → GQA attention of the new token over the cache (SDPA; the new token's K/V go in
a reserved last cache position, so every step and every mode reads the same cache) → O → residual;
RMSNorm → router → top-k → experts (``moe_math.experts_forward`` on the resident weights, or on the
(buffer, slots) an ``OffloadEngine`` returns) → residual.

Predictions. Random weights make a real predictor's guesses meaningless, so the benchmark uses a synthetic
one (``synthetic_predictions``): it *knows the true routing* of every layer (from a resident reference
run of the same step) and replaces each of the k picks, with probability 1 − h, by a random wrong expert.
Only its hit rate h matters for timing. The cost of a real router-based predictor (the seed's: the next
layer's gate applied to this layer's hidden state, then top-k) is still paid in the prefetching modes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from sgl_moe.offload.engine import OffloadEngine, read_ids
from sgl_moe.streaming.expert_store import ExpertStore, LayerWeights
from sgl_moe.streaming.moe_math import experts_forward, route
from sgl_moe.streaming.moe_stack import MoEStack, MoEStackConfig, _rms


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    try:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except TypeError:  # torch < 2.5: expand the KV heads
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))


class DecodeStack:
    def __init__(self, cfg: MoEStackConfig, device: torch.device | str, context: int, seed: int = 0) -> None:
        self.device = torch.device(device)
        self.cfg = cfg
        self.context = context
        self.seed = seed
        self._model = MoEStack(cfg, self.device, seed=seed)  # dense weights on the device, experts on the host
        self.dense = self._model.dense
        self.expert_layers = self._model.expert_layers
        self._resident: list[LayerWeights] | None = None
        self._caches: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def store(self, pin: bool = True) -> ExpertStore:
        return ExpertStore.to_host(self.expert_layers, pin=pin)

    def resident_weights(self) -> list[LayerWeights]:
        """Every layer's experts on the device (the reference; made once)."""
        if self._resident is None:
            self._resident = [LayerWeights(w.w13.to(self.device), w.w2.to(self.device)) for w in self.expert_layers]
        return self._resident

    def token_inputs(self, batch: int, seed: int) -> torch.Tensor:
        gen = torch.Generator(device="cpu").manual_seed(1000 + seed)
        return torch.randn(batch, self.cfg.hidden, generator=gen).to(self.cfg.torch_dtype).to(self.device)

    def _cache(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer K and V [B, kv_heads, context + 1, d]; the last position holds the current token."""
        if batch not in self._caches:
            cfg = self.cfg
            gen = torch.Generator(device="cpu").manual_seed(self.seed + 7 * batch)
            shape = (batch, cfg.kv_heads, self.context + 1, cfg.head_dim)
            self._caches[batch] = [tuple(torch.randn(*shape, generator=gen).to(cfg.torch_dtype).to(self.device)
                                         for _ in range(2)) for _ in range(cfg.layers)]  # type: ignore[misc]
        return self._caches[batch]

    def _attention(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        cfg, dense = self.cfg, self.dense[layer]
        b = x.shape[0]
        qkv = _rms(x, dense.norm1) @ dense.qkv.T
        q, k, v = qkv.split([cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim], -1)
        kc, vc = self._cache(b)[layer]
        kc[:, :, -1] = k.view(b, cfg.kv_heads, cfg.head_dim)
        vc[:, :, -1] = v.view(b, cfg.kv_heads, cfg.head_dim)
        att = _attend(q.view(b, cfg.heads, 1, cfg.head_dim), kc, vc)  # [B, heads, 1, d]
        return x + att.reshape(b, cfg.heads * cfg.head_dim) @ dense.o.T

    def step(self, x: torch.Tensor, engine: OffloadEngine | None = None,
             predicted: Sequence[torch.Tensor | None] | None = None, speculative: bool = False,
             on_layer: Callable[[int], None] | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One decode step: x [B, H] → ([B, H], the true expert ids [B, k] of each layer).

        ``engine`` None: resident experts. ``predicted[l]`` (None for layer 0): the experts predicted for
        layer l; the engine prefetches them during layer l−1. ``speculative``: layer l runs ``predicted[l]``
        with the router's probabilities at those experts, renormalised (the predicted gating weights).
        ``on_layer(l)`` is called at each layer's entry (per-layer timing)."""
        cfg = self.cfg
        resident = self.resident_weights() if engine is None else None
        true_ids = []
        for layer in range(cfg.layers):
            if on_layer:
                on_layer(layer)
            x = self._attention(x, layer)
            h = _rms(x, self.dense[layer].norm2)
            logits = h @ self.dense[layer].gate.T
            weights, ids = route(logits, cfg.top_k)
            true_ids.append(ids)
            run_w, run_ids = weights, ids
            guess = predicted[layer] if predicted is not None else None
            if speculative and guess is not None:
                probs = torch.softmax(logits.float(), dim=-1).gather(1, guess)
                run_w, run_ids = probs / probs.sum(dim=-1, keepdim=True), guess
            nxt = predicted[layer + 1] if predicted is not None and layer + 1 < cfg.layers else None
            if engine is None:
                moe = experts_forward(h, run_w, run_ids, resident[layer])  # type: ignore[index]
            else:
                if nxt is not None and engine.cfg.execution != "on_demand":
                    # The real predictor's cost (next layer's router on this hidden state); its guess is
                    # replaced by the synthetic one, which is what sets the hit rate.
                    torch.topk(h @ self.dense[layer + 1].gate.T, cfg.top_k, dim=-1)
                    # The layer's one device→host read: its ids and the next layer's prediction together, now,
                    # before acquire queues the wait for this layer's copy on the compute stream.
                    host_ids, nxt = read_ids(run_ids, nxt)
                else:
                    nxt = None
                    (host_ids,) = read_ids(run_ids)
                # Misses queue on the copy lane ahead of the prefetch.
                w, slots = engine.acquire(layer, run_ids, host_ids=host_ids)
                if nxt is not None:
                    engine.prefetch(layer + 1, nxt)
                moe = experts_forward(h, run_w, slots, w)
                engine.release(layer)
            x = x + moe
        return x, true_ids


def synthetic_predictions(true_ids: Sequence[torch.Tensor], hit_rates: Sequence[float], num_experts: int,
                          seed: int) -> list[torch.Tensor | None]:
    """Predicted ids per layer (None for layer 0): the true ids with each pick replaced, with probability
    1 − hit_rates[l], by a random expert outside the token's true set and its current prediction."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out: list[torch.Tensor | None] = [None]
    for layer in range(1, len(true_ids)):
        truth = true_ids[layer].cpu()
        pred = truth.clone()
        wrong = torch.rand(truth.shape, generator=gen) >= hit_rates[layer]
        for t, j in wrong.nonzero().tolist():
            taken = set(truth[t].tolist()) | set(pred[t].tolist())
            choices = [e for e in range(num_experts) if e not in taken]
            if choices:
                pred[t, j] = choices[int(torch.randint(len(choices), (1,), generator=gen))]
        out.append(pred.to(true_ids[layer].device))
    return out
