"""Per-token FLOPs constants of a transformer (dense or MoE), derived analytically from its HF config.

Pure Python: the router uses the same numbers (it receives them from ``GET /sgl_moe/info``) to
measure load in true FLOPs after prefix credit (seed 000, Eq. 2).

Counting rule: a matmul of an (n x a) activation by an (a x b) weight costs 2·n·a·b FLOPs. Attention
score and value products cost 2·head_dim FLOPs each per (query, key) pair and head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class FlopsModel:
    """FLOPs constants of one model; all per token (or per query-key pair), summed over all layers."""

    linear_flops_per_token: float
    """Every weight matmul a prompt token goes through: attention projections, router, the top-k
    routed experts (and shared experts / dense MLPs), over all layers. Excludes the LM head."""
    attn_flops_per_pair: float
    """Score (QK^T) plus value (PV) FLOPs for one query attending to one key, over all layers/heads."""
    lm_head_flops_per_token: float
    """Vocabulary projection for one position; a prefill-only request pays it once (last token)."""
    num_layers: int
    num_moe_layers: int

    def request_flops(self, cached_tokens: int, new_tokens: int, logit_positions: int = 1) -> float:
        """True cost of a prefill of ``new_tokens`` after ``cached_tokens`` already in the KV cache.

        Causal attention: new token j (0-based) attends to cached_tokens + j + 1 keys, so the pairs
        sum to S·P + S(S+1)/2.
        """
        if cached_tokens < 0 or new_tokens < 0:
            raise ValueError("token counts must be non-negative")
        s, p = new_tokens, cached_tokens
        pairs = s * p + s * (s + 1) / 2
        return s * self.linear_flops_per_token + pairs * self.attn_flops_per_pair + (
            logit_positions * self.lm_head_flops_per_token if s else 0.0
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlopsModel:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> FlopsModel:
        """Qwen3-MoE / Qwen2-MoE / Mixtral / dense Llama-style configs (``config.json`` as a dict)."""
        cfg = dict(cfg.get("text_config", cfg))
        h = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or h // heads)
        vocab = int(cfg["vocab_size"])
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        top_k = int(cfg.get("num_experts_per_tok") or 0)
        moe_inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
        dense_inter = int(cfg.get("intermediate_size") or 0)
        shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
        sparse_step = int(cfg.get("decoder_sparse_step") or 1)
        mlp_only = set(cfg.get("mlp_only_layers") or [])

        attn_proj = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
        moe_layers = 0
        params = 0  # weights touched per token, summed over layers
        for layer in range(layers):
            params += attn_proj
            is_moe = experts > 0 and layer not in mlp_only and (layer + 1) % sparse_step == 0
            if is_moe:
                moe_layers += 1
                params += h * experts + top_k * 3 * h * moe_inter
                if shared_inter:
                    params += 3 * h * shared_inter + h  # shared expert and its sigmoid gate
            else:
                params += 3 * h * dense_inter
        return cls(
            linear_flops_per_token=2.0 * params,
            attn_flops_per_pair=4.0 * heads * head_dim * layers,
            lm_head_flops_per_token=2.0 * h * vocab,
            num_layers=layers,
            num_moe_layers=moe_layers,
        )


def embedding_shape(cfg: dict[str, Any]) -> tuple[int, int]:
    """``(vocab_size, hidden_size)`` of a model's ``config.json`` (0 for a value it does not give)."""
    cfg = cfg.get("text_config", cfg)
    return int(cfg.get("vocab_size") or 0), int(cfg.get("hidden_size") or 0)
