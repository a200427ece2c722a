"""The layer stacks a ``DualBatchRunner`` drives: the ``LayerOps`` protocol (attention on a micro-batch's rows,
routing, expert weights on a device, the cost model's features) and two standalone stacks with random
Qwen3-MoE-shaped weights: ``DecodeLayers`` (one new token per sequence over a KV cache) and ``PrefillLayers``
(causal self-attention over new tokens). The SGLang adapter implements ``LayerOps`` over SGLang's modules.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from sgl_moe.offload.decode_stack import DecodeStack
from sgl_moe.streaming.expert_store import LayerWeights
from sgl_moe.streaming.moe_math import route
from sgl_moe.streaming.moe_stack import MoEStack, MoEStackConfig, _rms


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    except TypeError:  # torch < 2.5: expand the KV heads
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                              attn_mask=mask)


class LayerOps:
    """What the runner needs from a stack: attention on rows, routing, experts on a device."""

    cfg: MoEStackConfig
    device: torch.device
    dense: list
    _host_experts: list[LayerWeights]

    def __init__(self) -> None:
        self._placed: dict[torch.device, list[LayerWeights]] = {}

    def route(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [..., H] → (normed tokens [T, H], weights [T, k] fp32, ids [T, k])."""
        h = _rms(x, self.dense[layer].norm2).reshape(-1, self.cfg.hidden)
        weights, ids = route(h @ self.dense[layer].gate.T, self.cfg.top_k)
        return h, weights, ids

    def expert_weights(self, device: torch.device) -> list[LayerWeights]:
        """Every layer's experts on ``device`` (host ones are the stack's own; device copies made once)."""
        if device.type == "cpu":
            return self._host_experts
        if device not in self._placed:
            self._placed[device] = [LayerWeights(w.w13.to(device), w.w2.to(device)) for w in self._host_experts]
        return self._placed[device]

    def attend(self, layer: int, x: torch.Tensor, rows: slice) -> torch.Tensor:
        raise NotImplementedError

    def work(self, rows: slice) -> tuple[int, int]:
        """(new tokens, Σ n_i·c_i) of the sequences ``rows``: the cost model's features."""
        raise NotImplementedError

    @property
    def batch(self) -> int:
        raise NotImplementedError


class DecodeLayers(LayerOps):
    """``DecodeStack``'s layers (its weights) decoding one token per sequence over a KV cache of
    ``contexts[i]`` tokens for sequence i. The cache is padded to the longest context (a mask hides the
    padding when contexts differ); the new token's K/V go in the last position, as in ``DecodeStack``."""

    def __init__(self, stack: DecodeStack, contexts: Sequence[int], seed: int = 0) -> None:
        super().__init__()
        self.stack, self.cfg, self.device, self.dense = stack, stack.cfg, stack.device, stack.dense
        self._host_experts = stack.expert_layers
        self.contexts = list(contexts)
        cfg, cmax = self.cfg, max(self.contexts)
        # Generated where it lives (GBs at long contexts); values differ by device, which nothing compares.
        gen = torch.Generator(device=self.device).manual_seed(seed + 7 * len(self.contexts))
        shape = (len(self.contexts), cfg.kv_heads, cmax + 1, cfg.head_dim)
        self.cache = [tuple(torch.randn(*shape, generator=gen, device=self.device, dtype=cfg.torch_dtype)
                            for _ in range(2)) for _ in range(cfg.layers)]
        self.mask: torch.Tensor | None = None
        if min(self.contexts) != cmax:
            pos = torch.arange(cmax + 1)
            ctx = torch.tensor(self.contexts).unsqueeze(1)
            self.mask = ((pos < ctx) | (pos == cmax)).view(len(self.contexts), 1, 1, cmax + 1).to(self.device)

    @property
    def batch(self) -> int:
        return len(self.contexts)

    def inputs(self, seed: int = 0) -> torch.Tensor:
        return self.stack.token_inputs(self.batch, seed)  # [B, H]

    def work(self, rows: slice) -> tuple[int, int]:
        ctx = self.contexts[rows]
        return len(ctx), sum(ctx)

    def attend(self, layer: int, x: torch.Tensor, rows: slice) -> torch.Tensor:
        cfg, dense = self.cfg, self.dense[layer]
        b, d = x.shape[0], cfg.head_dim
        qkv = _rms(x, dense.norm1) @ dense.qkv.T
        q, k, v = qkv.split([cfg.heads * d, cfg.kv_heads * d, cfg.kv_heads * d], -1)
        kc, vc = (t[rows] for t in self.cache[layer])  # views: micro-batches are contiguous row ranges
        kc[:, :, -1] = k.view(b, cfg.kv_heads, d)
        vc[:, :, -1] = v.view(b, cfg.kv_heads, d)
        mask = None if self.mask is None else self.mask[rows]
        att = _attend(q.view(b, cfg.heads, 1, d), kc, vc, mask)  # [b, heads, 1, d]
        return x + att.reshape(b, cfg.heads * d) @ dense.o.T


class PrefillLayers(LayerOps):
    """``MoEStack``'s layers over ``batch`` sequences of ``seq`` new tokens (causal self-attention)."""

    def __init__(self, stack: MoEStack, batch: int, seq: int) -> None:
        super().__init__()
        self.stack, self.cfg, self.device, self.dense = stack, stack.cfg, stack.device, stack.dense
        self._host_experts = stack.expert_layers
        self._batch, self.seq = batch, seq

    @property
    def batch(self) -> int:
        return self._batch

    def inputs(self, seed: int = 1) -> torch.Tensor:
        return self.stack.inputs(self._batch, self.seq, seed)  # [B, S, H]

    def work(self, rows: slice) -> tuple[int, int]:
        b = len(range(self._batch)[rows])
        return b * self.seq, b * self.seq * self.seq

    def attend(self, layer: int, x: torch.Tensor, rows: slice) -> torch.Tensor:
        return self.stack.attention(x, self.dense[layer])
