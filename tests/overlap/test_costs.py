"""The least-squares fit recovers the coefficients it was generated from."""

import pytest

from sgl_moe.overlap.costs import CostModel, Sample


def test_fit_recovers_linear_models():
    true = CostModel(attn_alpha=2e-5, attn_beta=3e-9, attn_gamma=4e-6, moe_alpha=5e-5, moe_beta=6e-6)
    samples = []
    for tokens in (1, 4, 16, 64):
        for ctx in (512, 4096):
            samples.append(Sample("attention", tokens, tokens * ctx, true.attention_s(tokens, tokens * ctx)))
        samples.append(Sample("moe", tokens, 0, true.moe_s(tokens)))
    fit = CostModel.fit(samples)
    for field in ("attn_alpha", "attn_beta", "attn_gamma", "moe_alpha", "moe_beta"):
        assert getattr(fit, field) == pytest.approx(getattr(true, field), rel=1e-6)


def test_fit_drops_negative_coefficients():
    samples = [Sample("attention", t, t * 100, 1e-3) for t in (1, 2, 4)]  # flat: no per-token cost
    samples += [Sample("moe", t, 0, 1e-3 - 1e-6 * t) for t in (1, 2, 4)]  # decreasing: noise
    fit = CostModel.fit(samples)
    assert min(fit.attn_beta, fit.attn_gamma, fit.moe_beta) >= 0.0
