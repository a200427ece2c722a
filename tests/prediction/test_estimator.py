"""The estimator: output shapes, layer embeddings, and that distillation learns a learnable mapping."""

import pytest
import torch

from sgl_moe.prediction.estimator import EstimatorConfig, ExpertEstimator, distillation_loss


def test_forward_shapes_for_one_layer_and_for_mixed_layers():
    est = ExpertEstimator(EstimatorConfig(hidden=16, latent=8, mlp=12, num_layers=3, num_experts=10))
    q = torch.randn(7, 16)
    assert est(q, 2).shape == (7, 10)
    layers = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    mixed = est(q, layers)
    assert mixed.shape == (7, 10)
    torch.testing.assert_close(mixed[1], est(q[1:2], 1)[0])


def test_an_unknown_source_layer_is_refused():
    est = ExpertEstimator(EstimatorConfig(hidden=4, latent=4, mlp=4, num_layers=2, num_experts=3))
    with pytest.raises(ValueError, match="source layer 2"):
        est(torch.zeros(1, 4), 2)


def test_short_distillation_on_a_learnable_mapping_lowers_kl():
    torch.manual_seed(0)
    H, E, S = 16, 8, 3
    teachers = torch.randn(S, E, H) * 2  # per-source-layer linear routers: learnable, layer-dependent
    q = torch.randn(S, 512, H)
    target = torch.einsum("sth,seh->ste", q, teachers)
    layer_of = torch.arange(S).repeat_interleave(512)
    x, y = q.reshape(-1, H), target.reshape(-1, E)
    est = ExpertEstimator(EstimatorConfig(hidden=H, latent=32, mlp=64, num_layers=S, num_experts=E))
    opt = torch.optim.AdamW(est.parameters(), lr=3e-3)
    with torch.no_grad():
        before = distillation_loss(est(x, layer_of), y).item()
    for _ in range(300):
        loss = distillation_loss(est(x, layer_of), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = loss.item()
    assert after < 0.25 * before, (before, after)


def test_distillation_loss_is_zero_for_identical_logits_and_positive_otherwise():
    a = torch.randn(5, 4)
    assert distillation_loss(a, a).item() == pytest.approx(0.0, abs=1e-6)
    assert distillation_loss(a, a.flip(-1)).item() > 0
