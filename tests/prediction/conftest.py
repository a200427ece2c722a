"""Shared fixtures for the prediction tests: a small synthetic bundle and the shipped model's location."""

from pathlib import Path

import pytest
import torch

import sgl_moe
from sgl_moe.prediction import DefaultVectors, EstimatorConfig, ExpertEstimator, PredictorBundle

MODEL_DIR = Path(sgl_moe.__file__).parent / "models" / "tiny-qwen3-moe"

L, E, H, K = 4, 8, 16, 2


@pytest.fixture
def model_dir() -> Path:
    return MODEL_DIR


@pytest.fixture
def synthetic_bundle() -> PredictorBundle:
    """L=4 layers, E=8 experts, H=16, an untrained estimator, hybrid on target layer 2 only."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    cfg = EstimatorConfig(hidden=H, latent=8, mlp=16, num_layers=L - 1, num_experts=E)
    return PredictorBundle(defaults=DefaultVectors(torch.randn(L, E, H, generator=g)),
                           estimator=ExpertEstimator(cfg).eval(), estimator_config=cfg,
                           hybrid_layers=frozenset({2}),
                           recall=[{"layer": l + 1, "router": 0.5, "estimator": 0.6} for l in range(L - 1)],
                           facts={"train_tokens": 123})


@pytest.fixture
def synthetic_model_weights() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Gate weights [E, H] and router-input norm weights [H] for each of the L synthetic layers."""
    g = torch.Generator().manual_seed(1)
    return ([torch.randn(E, H, generator=g) for _ in range(L)],
            [1 + 0.1 * torch.randn(H, generator=g) for _ in range(L)])
