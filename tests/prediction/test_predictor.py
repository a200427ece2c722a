"""NextLayerPredictor: each kind computes what it promises; misuse is refused with a clear error."""

import pytest
import torch

from sgl_moe.prediction import NextLayerPredictor, quasi_hidden, router_predict
from sgl_moe.streaming.moe_math import route

K = 2  # the synthetic fixtures' shape: L layers, E experts, H hidden (see conftest.py)
L, E, H = 4, 8, 16


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    residual = torch.randn(10, H, generator=g) * 3
    w, ids = route(torch.randn(10, E, generator=g), K)
    return residual, w, ids


def _predictor(bundle, weights, kind):
    gates, norms = weights
    return NextLayerPredictor(bundle, gates, norms, eps=1e-6, top_k=K, kind=kind)


def test_router_kind_is_the_next_gate_on_the_quasi_hidden_state(synthetic_bundle, synthetic_model_weights):
    gates, norms = synthetic_model_weights
    residual, w, ids = _inputs()
    got_w, got_ids = _predictor(synthetic_bundle, synthetic_model_weights, "router").predict(1, residual, w, ids)
    q = quasi_hidden(residual, synthetic_bundle.defaults.layer_default(1, w, ids), norms[2], 1e-6)
    want_w, want_ids = router_predict(q, gates[2], K)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w)


def test_hybrid_uses_the_estimator_exactly_on_hybrid_layers(synthetic_bundle, synthetic_model_weights):
    preds = {k: _predictor(synthetic_bundle, synthetic_model_weights, k) for k in ("router", "estimator", "hybrid")}
    residual, w, ids = _inputs()
    for layer in range(L - 1):
        hybrid = preds["hybrid"].predict(layer, residual, w, ids)
        expected = preds["estimator" if layer + 1 in synthetic_bundle.hybrid_layers else "router"].predict(
            layer, residual, w, ids)
        other = preds["router" if layer + 1 in synthetic_bundle.hybrid_layers else "estimator"].predict(
            layer, residual, w, ids)
        assert torch.equal(hybrid[1], expected[1]), layer
        assert not torch.equal(hybrid[1], other[1]), layer  # the two kinds differ, so the check can fail


def test_any_dtype_in_fp32_and_int64_out(synthetic_bundle, synthetic_model_weights):
    pred = _predictor(synthetic_bundle, synthetic_model_weights, "estimator")
    residual, w, ids = _inputs()
    out_w, out_ids = pred.predict(0, residual.to(torch.bfloat16), w.to(torch.bfloat16), ids.to(torch.int32))
    assert out_w.dtype == torch.float32 and out_ids.dtype == torch.int64 and out_ids.shape == (10, K)
    torch.testing.assert_close(out_w.sum(-1), torch.ones(10))


def test_kinds_needing_an_estimator_refuse_a_bundle_without_one(synthetic_bundle, synthetic_model_weights):
    synthetic_bundle.estimator = None
    for kind in ("estimator", "hybrid"):
        with pytest.raises(ValueError, match="needs an estimator"):
            _predictor(synthetic_bundle, synthetic_model_weights, kind)
    _predictor(synthetic_bundle, synthetic_model_weights, "router")


def test_the_last_layer_has_nothing_to_predict(synthetic_bundle, synthetic_model_weights):
    pred = _predictor(synthetic_bundle, synthetic_model_weights, "router")
    with pytest.raises(ValueError, match="last layer"):
        pred.predict(L - 1, *_inputs())


def test_unknown_kind_is_refused(synthetic_bundle, synthetic_model_weights):
    with pytest.raises(ValueError, match="unknown prediction kind"):
        _predictor(synthetic_bundle, synthetic_model_weights, "oracle")
