"""Parameter-free signals for next-layer expert prediction (seed 003 §3).

Shapes: T tokens, H hidden, E experts per layer, k experts per token, L MoE layers.

At layer l the post-attention residual r_l is known before the MoE block runs. Layer l+1 routes on
s_{l+1} = RMSNorm_{l+1}(r_{l+1}), and r_{l+1} = r_l + moe_l + attn_{l+1}. The quasi-hidden state stands in
for the unknown part with the *default vector* d_l: the routing-weighted mean output of layer l's experts,
q_l = RMSNorm_{l+1}(r_l + d_l). Running layer l+1's own router on q_l is router-based prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_moe.streaming.moe_math import route


@dataclass
class DefaultVectors:
    """Per layer and expert, the mean unweighted output of the expert's FFN over the tokens routed to it."""

    vectors: torch.Tensor
    """[L, E, H] float32."""
    counts: torch.Tensor | None = None
    """[L, E] how many tokens were routed to each expert when the vectors were computed (None if unknown):
    the activation frequencies that pick resident experts."""

    def layer_default(self, layer: int, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """d_l = Σ_j weights[t, j] · vectors[layer, ids[t, j]]; weights, ids [T, k] -> [T, H] float32."""
        table = self.vectors[layer]  # [E, H]
        picked = table[ids.long()]  # [T, k, H]
        return torch.einsum("tk,tkh->th", weights.float(), picked.float())

    @classmethod
    def from_sums(cls, sums: torch.Tensor, counts: torch.Tensor) -> DefaultVectors:
        """From accumulated per-expert output sums [L, E, H] and token counts [L, E].

        An expert never routed to gets a zero vector: it contributes nothing, which is what an
        unseen expert's mean would be under a symmetric prior.
        """
        denom = counts.to(torch.float64).clamp_min(1).unsqueeze(-1)
        return cls(vectors=(sums.to(torch.float64) / denom).float(), counts=counts.to(torch.int64))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm in float32: x · rsqrt(mean(x²) + eps) · w."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def quasi_hidden(residual: torch.Tensor, default: torch.Tensor, norm_weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """q_l = RMSNorm_{l+1}(r_l + d_l): residual, default [T, H]; norm_weight [H] -> [T, H] float32."""
    return rms_norm(residual.float() + default.float(), norm_weight, eps)


def router_predict(q: torch.Tensor, gate_weight: torch.Tensor, top_k: int,
                   renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The next layer's own gate on q: q [T, H], gate_weight [E, H] -> (weights [T, k] fp32, ids [T, k])."""
    logits = q.float() @ gate_weight.float().T  # [T, E]
    return route(logits, top_k, renormalize)


def recall_at_k(pred_ids: torch.Tensor, true_ids: torch.Tensor) -> torch.Tensor:
    """|pred ∩ true| / k per token: pred_ids, true_ids [T, k] -> [T] float32 (ids within a row are distinct)."""
    k = true_ids.shape[-1]
    hits = (pred_ids.unsqueeze(-1) == true_ids.unsqueeze(-2)).any(-1).sum(-1)
    return hits.float() / k
