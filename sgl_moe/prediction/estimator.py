"""The learned next-layer expert estimator (seed 003 §6.1, Appendix A).

One small network shared by every source layer l: q_l [T, H] -> predicted router logits of layer l+1 [T, E].

    z = A q + pos[l]                 A: H -> latent, pos: one learned vector per source layer
    z = z + C silu(B z)              B: latent -> mlp, C: mlp -> latent (residual MLP)
    logits = head(LayerNorm(z))      head: latent -> E
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class EstimatorConfig:
    hidden: int
    """Model hidden size H (the width of q_l)."""
    latent: int = 128
    """Width after the input projection A."""
    mlp: int = 256
    """Inner width of the residual MLP."""
    num_layers: int = 1
    """Number of source layers l with a learned layer embedding (L - 1 for an L-layer model)."""
    num_experts: int = 1
    """Router width E of the predicted layer."""

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class ExpertEstimator(nn.Module):
    """Predicts layer l+1's router logits from the quasi-hidden state q_l."""

    def __init__(self, cfg: EstimatorConfig):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(cfg.hidden, cfg.latent)
        self.layer_embedding = nn.Embedding(cfg.num_layers, cfg.latent)
        self.up = nn.Linear(cfg.latent, cfg.mlp)
        self.down = nn.Linear(cfg.mlp, cfg.latent)
        self.norm = nn.LayerNorm(cfg.latent)
        self.head = nn.Linear(cfg.latent, cfg.num_experts)
        nn.init.normal_(self.layer_embedding.weight, std=0.02)

    def forward(self, q: torch.Tensor, layer: int | torch.Tensor) -> torch.Tensor:
        """q [T, H]; layer: a source layer index, or a [T] tensor of them (mixed-layer training batches)."""
        if isinstance(layer, int):
            if not 0 <= layer < self.cfg.num_layers:
                raise ValueError(f"source layer {layer} outside [0, {self.cfg.num_layers})")
            pos = self.layer_embedding.weight[layer]  # [latent], broadcast over T
        else:
            pos = self.layer_embedding(layer)  # [T, latent]
        z = self.proj(q) + pos
        z = z + self.down(F.silu(self.up(z)))
        return self.head(self.norm(z))  # [T, E]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(softmax(teacher) ‖ softmax(student)); both [T, E]."""
    return F.kl_div(F.log_softmax(student_logits.float(), -1), F.log_softmax(teacher_logits.float(), -1),
                    log_target=True, reduction="batchmean")
