"""The shipped predictor artefact: default vectors, the estimator and its held-out recall, in one folder.

    <model_dir>/expert_predictor/predictor.safetensors   default_vectors [L, E, H]; estimator.* weights
    <model_dir>/expert_predictor/predictor.json          estimator config, hybrid layers, recall table, facts
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sgl_moe.prediction.estimator import EstimatorConfig, ExpertEstimator
from sgl_moe.prediction.signals import DefaultVectors
from sgl_moe.wire import PREDICTOR_DIR

BUNDLE_DIRNAME = PREDICTOR_DIR
"""Where `python -m sgl_moe.prediction.train` saves the bundle (the name is shared with the launcher via wire)."""
TENSORS_FILE = "predictor.safetensors"
META_FILE = "predictor.json"
FORMAT_VERSION = 1
_ESTIMATOR_PREFIX = "estimator."


class BundleError(ValueError):
    """A bundle folder is missing a file or holds one that cannot be read."""


@dataclass
class PredictorBundle:
    """Everything a NextLayerPredictor needs besides the model's own gate and norm weights."""

    defaults: DefaultVectors
    estimator: ExpertEstimator | None = None
    estimator_config: EstimatorConfig | None = None
    hybrid_layers: frozenset[int] = frozenset()
    """Target layers l+1 where hybrid prediction uses the estimator (the router on q_l elsewhere)."""
    recall: list[dict[str, Any]] = field(default_factory=list)
    """Held-out recall@k by target layer: [{"layer": l+1, "router": r, "estimator": e}, ...]."""
    facts: dict[str, Any] = field(default_factory=dict)
    """How it was made: model, token counts, seed, threshold, timings."""

    @property
    def num_layers(self) -> int:
        return self.defaults.vectors.shape[0]

    @property
    def frequencies(self) -> torch.Tensor | None:
        """[L, E] share of each layer's routed tokens per expert on the training text, or None if not recorded."""
        c = self.defaults.counts
        return None if c is None else c.double() / c.sum(dim=-1, keepdim=True).clamp_min(1)

    def save(self, out_dir: Path) -> Path:
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        tensors = {"default_vectors": self.defaults.vectors.detach().float().contiguous().cpu()}
        if self.defaults.counts is not None:
            tensors["expert_counts"] = self.defaults.counts.detach().to(torch.int64).contiguous().cpu()
        if self.estimator is not None:
            for name, t in self.estimator.state_dict().items():
                tensors[_ESTIMATOR_PREFIX + name] = t.detach().float().contiguous().cpu()
        save_file(tensors, str(out_dir / TENSORS_FILE))
        meta = {
            "format_version": FORMAT_VERSION,
            "estimator_config": None if self.estimator_config is None else self.estimator_config.to_dict(),
            "hybrid_layers": sorted(self.hybrid_layers),
            "recall": self.recall,
            "facts": self.facts,
        }
        (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return out_dir

    @classmethod
    def load(cls, bundle_dir: Path) -> PredictorBundle:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        bundle_dir = Path(bundle_dir)
        meta_path, tensors_path = bundle_dir / META_FILE, bundle_dir / TENSORS_FILE
        for path in (meta_path, tensors_path):
            if not path.is_file():
                raise BundleError(f"expert predictor bundle: missing file {path}")
        try:
            meta = json.loads(meta_path.read_text())
            version = meta["format_version"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise BundleError(f"expert predictor bundle: cannot read {meta_path}: {exc}") from exc
        if version != FORMAT_VERSION:
            raise BundleError(f"expert predictor bundle: {meta_path} has format {version}, expected {FORMAT_VERSION}")
        try:
            tensors = load_file(str(tensors_path))
            vectors = tensors["default_vectors"]
        except (SafetensorError, OSError, KeyError) as exc:
            raise BundleError(f"expert predictor bundle: cannot read {tensors_path}: {exc}") from exc

        estimator = config = None
        if meta.get("estimator_config") is not None:
            config = EstimatorConfig(**meta["estimator_config"])
            estimator = ExpertEstimator(config)
            state = {k[len(_ESTIMATOR_PREFIX):]: v for k, v in tensors.items() if k.startswith(_ESTIMATOR_PREFIX)}
            try:
                estimator.load_state_dict(state)
            except RuntimeError as exc:
                raise BundleError(f"expert predictor bundle: estimator weights in {tensors_path}: {exc}") from exc
            estimator.eval().requires_grad_(False)
        return cls(defaults=DefaultVectors(vectors, tensors.get("expert_counts")), estimator=estimator,
                   estimator_config=config,
                   hybrid_layers=frozenset(int(x) for x in meta.get("hybrid_layers", [])),
                   recall=list(meta.get("recall", [])), facts=dict(meta.get("facts", {})))


def find_bundle(model_dir: Path | str) -> Path | None:
    """``<model_dir>/expert_predictor/`` if it holds a bundle, else None."""
    candidate = Path(model_dir) / BUNDLE_DIRNAME
    return candidate if (candidate / META_FILE).is_file() and (candidate / TENSORS_FILE).is_file() else None
