"""A stack of MoE decoder layers with random weights, driven through a ``WeightStreamer``: the benchmark
and test model of the streaming engine (no SGLang).

Each layer: RMSNorm → QKV → causal GQA attention (SDPA) → O → residual; RMSNorm → router → top-k → experts
(weights from ``streamer.acquire``) → residual. Rotary embeddings are left out: they cost O(T·H) and do not
change the layer's arithmetic intensity. Input: B sequences of S tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from sgl_moe.streaming.expert_store import ExpertStore, LayerWeights
from sgl_moe.streaming.moe_math import experts_forward, route


@dataclass(frozen=True)
class MoEStackConfig:
    hidden: int = 2048
    heads: int = 32
    kv_heads: int = 4
    head_dim: int = 128
    experts: int = 128
    top_k: int = 8
    expert_width: int = 768
    layers: int = 8
    dtype: str = "bfloat16"

    @classmethod
    def qwen3_30b_a3b(cls, layers: int = 8) -> MoEStackConfig:
        """Qwen3-30B-A3B's layer shape (the model has 48 such layers)."""
        return cls(layers=layers)

    @classmethod
    def tiny(cls, layers: int = 4) -> MoEStackConfig:
        return cls(hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_width=32,
                   layers=layers, dtype="float32")

    def with_layers(self, layers: int) -> MoEStackConfig:
        return replace(self, layers=layers)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def expert_layer_bytes(self) -> int:
        element_size = torch.tensor([], dtype=self.torch_dtype).element_size()
        return 3 * self.hidden * self.expert_width * self.experts * element_size

    def flops(self, batch: int, seq: int) -> float:
        """FLOPs of one forward over ``batch`` sequences of ``seq`` tokens (2 per multiply-add, causal)."""
        h, d = self.hidden, self.head_dim
        proj = h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h
        per_token = 2 * (proj + h * self.experts + self.top_k * 3 * h * self.expert_width)
        pairs = seq * (seq + 1) / 2
        return self.layers * batch * (seq * per_token + pairs * 4 * self.heads * d)


@dataclass
class DenseLayer:
    """The non-expert weights of one layer (always resident)."""

    norm1: torch.Tensor
    qkv: torch.Tensor  # [(heads + 2·kv_heads)·d, H]
    o: torch.Tensor  # [H, heads·d]
    norm2: torch.Tensor
    gate: torch.Tensor  # [E, H]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class MoEStack:
    def __init__(self, cfg: MoEStackConfig, device: torch.device | str, seed: int = 0) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        dt = cfg.torch_dtype
        h, d = cfg.hidden, cfg.head_dim

        def rand(*shape: int, scale: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(dt)

        self.dense = [DenseLayer(
            norm1=torch.ones(h, dtype=dt, device=self.device),
            qkv=rand((cfg.heads + 2 * cfg.kv_heads) * d, h, scale=h ** -0.5).to(self.device),
            o=rand(h, cfg.heads * d, scale=(cfg.heads * d) ** -0.5).to(self.device),
            norm2=torch.ones(h, dtype=dt, device=self.device),
            gate=rand(cfg.experts, h, scale=h ** -0.5).to(self.device),
        ) for _ in range(cfg.layers)]
        # Expert weights are created on the host: the store is their home in every mode.
        self.expert_layers = [LayerWeights(
            w13=rand(cfg.experts, 2 * cfg.expert_width, h, scale=h ** -0.5),
            w2=rand(cfg.experts, h, cfg.expert_width, scale=cfg.expert_width ** -0.5),
        ) for _ in range(cfg.layers)]

    def store(self, pin: bool = True) -> ExpertStore:
        return ExpertStore.to_host(self.expert_layers, pin=pin)

    def inputs(self, batch: int, seq: int, seed: int = 1) -> torch.Tensor:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return torch.randn(batch, seq, self.cfg.hidden, generator=gen).to(self.cfg.torch_dtype).to(self.device)

    def attention(self, x: torch.Tensor, layer: DenseLayer) -> torch.Tensor:
        cfg = self.cfg
        b, s, _ = x.shape
        qkv = _rms(x, layer.norm1) @ layer.qkv.T
        q, k, v = qkv.split([cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim], -1)
        q = q.view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = k.view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        rep = cfg.heads // cfg.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + att.transpose(1, 2).reshape(b, s, cfg.heads * cfg.head_dim) @ layer.o.T

    def forward(self, x: torch.Tensor, streamer) -> torch.Tensor:
        """x [B, S, H] → [B, S, H]; expert weights of layer l come from ``streamer.acquire(l)``."""
        b, s, h = x.shape
        for i, layer in enumerate(self.dense):
            x = self.attention(x, layer)
            flat = _rms(x, layer.norm2).reshape(b * s, h)
            weights, ids = route(flat @ layer.gate.T, self.cfg.top_k)
            w = streamer.acquire(i)
            moe = experts_forward(flat, weights, ids, w)
            streamer.release(i)
            x = x + moe.view(b, s, h)
        return x
