"""The bundle: save/load round trip, clear errors naming the bad file, and discovery under a model dir."""

import pytest
import torch

from sgl_moe.prediction.bundle import BUNDLE_DIRNAME, META_FILE, TENSORS_FILE, BundleError, PredictorBundle, find_bundle


def test_save_load_round_trip(tmp_path, synthetic_bundle):
    synthetic_bundle.save(tmp_path)
    loaded = PredictorBundle.load(tmp_path)
    assert torch.equal(loaded.defaults.vectors, synthetic_bundle.defaults.vectors)
    assert loaded.hybrid_layers == frozenset({2})
    assert loaded.recall == synthetic_bundle.recall
    assert loaded.facts == {"train_tokens": 123}
    assert loaded.estimator_config == synthetic_bundle.estimator_config
    q = torch.randn(5, synthetic_bundle.estimator_config.hidden)
    torch.testing.assert_close(loaded.estimator(q, 1), synthetic_bundle.estimator(q, 1).detach(), rtol=0, atol=0)


def test_expert_counts_round_trip_as_frequencies(tmp_path, synthetic_bundle):
    assert synthetic_bundle.frequencies is None  # not recorded: no resident-expert choice from it
    counts = torch.tensor([[3, 1, 0, 0, 0, 0, 0, 4]] * 4)
    synthetic_bundle.defaults.counts = counts
    synthetic_bundle.save(tmp_path)
    freqs = PredictorBundle.load(tmp_path).frequencies
    assert torch.equal(PredictorBundle.load(tmp_path).defaults.counts, counts)
    assert freqs[0].tolist() == [0.375, 0.125, 0, 0, 0, 0, 0, 0.5]


def test_a_bundle_without_estimator_round_trips(tmp_path, synthetic_bundle):
    synthetic_bundle.estimator = synthetic_bundle.estimator_config = None
    synthetic_bundle.save(tmp_path)
    assert PredictorBundle.load(tmp_path).estimator is None


@pytest.mark.parametrize("missing", [META_FILE, TENSORS_FILE])
def test_missing_file_error_names_it(tmp_path, synthetic_bundle, missing):
    synthetic_bundle.save(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(BundleError, match=missing):
        PredictorBundle.load(tmp_path)


@pytest.mark.parametrize("corrupt", [META_FILE, TENSORS_FILE])
def test_corrupt_file_error_names_it(tmp_path, synthetic_bundle, corrupt):
    synthetic_bundle.save(tmp_path)
    (tmp_path / corrupt).write_bytes(b"\x00not what it should be")
    with pytest.raises(BundleError, match=corrupt):
        PredictorBundle.load(tmp_path)


def test_find_bundle(tmp_path, synthetic_bundle):
    assert find_bundle(tmp_path) is None
    synthetic_bundle.save(tmp_path / BUNDLE_DIRNAME)
    assert find_bundle(tmp_path) == tmp_path / BUNDLE_DIRNAME
