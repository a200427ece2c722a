"""The shipped bundle for the tiny model: loads, stays small, is package data, and earns its keep."""

import fnmatch
import tomllib
from pathlib import Path

import torch

from sgl_moe.prediction import PredictorBundle, find_bundle

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_bundle_loads_and_matches_the_model(model_dir):
    path = find_bundle(model_dir)
    assert path is not None
    bundle = PredictorBundle.load(path)
    assert bundle.defaults.vectors.shape == (6, 32, 128)
    assert bundle.estimator is not None and bundle.estimator_config.num_layers == 5
    assert sum(f.stat().st_size for f in path.iterdir()) < 1_000_000
    freqs = bundle.frequencies  # routed-token counts on the training text: what picks resident experts
    assert freqs is not None and freqs.shape == (6, 32)
    assert torch.allclose(freqs.sum(dim=-1), torch.ones(6, dtype=freqs.dtype))


def test_estimator_beats_the_router_where_the_router_is_weakest(model_dir):
    bundle = PredictorBundle.load(model_dir / "expert_predictor")
    weakest = min(bundle.recall, key=lambda r: r["router"])
    assert weakest["estimator"] > weakest["router"], weakest
    assert weakest["layer"] in bundle.hybrid_layers


def test_bundle_files_are_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sgl_moe"]
    package_root = ROOT / "sgl_moe"  # the source tree: an installed copy holds only what the patterns matched
    for f in (package_root / "models" / "tiny-qwen3-moe" / "expert_predictor").iterdir():
        rel = f.relative_to(package_root).as_posix()
        assert any(fnmatch.fnmatchcase(rel, p) for p in patterns), rel
