"""End to end on the shipped model: a short train.py run writes a loadable bundle; speculative hooks
execute the predicted experts and leave the model untouched afterwards."""

import torch

from sgl_moe.prediction import KINDS, NextLayerPredictor, PredictorBundle
from sgl_moe.prediction import train as train_cli
from sgl_moe.prediction.activations import ModelView, load_model
from sgl_moe.prediction.quality import speculative_routing


def test_short_train_run_writes_a_bundle(tmp_path, model_dir):
    out = tmp_path / "bundle"
    train_cli.main(["--model", str(model_dir), "--out", str(out), "--train-tokens", "4096",
                    "--heldout-tokens", "1024", "--epochs", "1", "--batch-size", "512", "--threads", "2"])
    bundle = PredictorBundle.load(out)
    assert bundle.defaults.vectors.shape == (6, 32, 128)
    assert [r["layer"] for r in bundle.recall] == [1, 2, 3, 4, 5]
    assert all(0 <= r[k] <= 1 for r in bundle.recall for k in ("router", "estimator", "hybrid"))
    assert bundle.facts["train_tokens"] == 4096
    # Hybrid layers are exactly those below the threshold where the estimator wins.
    assert bundle.hybrid_layers == {r["layer"] for r in bundle.recall
                                    if r["router"] < 0.8 and r["estimator"] > r["router"]}


class _FixedPredictor:
    """Predicts experts (3, 7) with weights (0.6, 0.4) for every token of every layer."""

    def predict(self, layer, residual, weights, ids):
        t = residual.shape[0]
        return torch.tensor([[0.6, 0.4]]).expand(t, 2), torch.tensor([[3, 7]]).expand(t, 2)


def test_speculative_routing_executes_the_prediction_and_unhooks(model_dir):
    model = load_model(model_dir)
    x = torch.randint(4, 4000, (1, 32), generator=torch.Generator().manual_seed(0))
    executed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(l):
        return lambda _m, args, _o: executed.__setitem__(l, (args[1].clone(), args[2].clone()))

    handles = [layer.mlp.experts.register_forward_hook(record(l)) for l, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        exact = model(input_ids=x).logits
        true_routing = dict(executed)
        with speculative_routing(model, _FixedPredictor()):  # type: ignore[arg-type]
            model(input_ids=x)
        speculative = dict(executed)
        again = model(input_ids=x).logits
    for h in handles:
        h.remove()
    assert torch.equal(speculative[0][0], true_routing[0][0])  # layer 0 runs its own routing
    for layer in range(1, 6):
        ids, weights = speculative[layer]
        assert (ids == torch.tensor([3, 7])).all(), layer
        torch.testing.assert_close(weights, torch.tensor([[0.6, 0.4]]).expand(32, 2))
    assert not (true_routing[1][0] == torch.tensor([3, 7])).all()  # so the check above can fail
    assert torch.equal(again, exact)  # hooks removed


def test_every_kind_builds_a_predictor_from_the_shipped_model(model_dir):
    model = load_model(model_dir)
    view = ModelView.of(model)
    bundle = PredictorBundle.load(model_dir / "expert_predictor")
    for kind in KINDS:
        NextLayerPredictor(bundle, view.gate_weights, view.norm_weights, view.eps, view.top_k, kind)
