"""Next-layer expert prediction for MoE prefetching (seed 003: default vectors, quasi-hidden state,
router-based prediction and a learned estimator).

    signals     default vectors, the quasi-hidden state, router-based prediction, recall@k
    estimator   the learned estimator network and its distillation loss
    bundle      the shipped artefact (<model>/expert_predictor/): save, load, find
    predictor   NextLayerPredictor: the inference-time front door, kinds router / estimator / hybrid
    activations offline capture from the HF model (train / held-out windows)
    train       CLI: build and save a bundle          python -m sgl_moe.prediction.train --model DIR
    quality     CLI: recall, drift, speculative runs  python -m sgl_moe.prediction.quality --model DIR
"""

from sgl_moe.prediction.bundle import BundleError, PredictorBundle, find_bundle
from sgl_moe.prediction.estimator import EstimatorConfig, ExpertEstimator
from sgl_moe.prediction.predictor import KINDS, NextLayerPredictor
from sgl_moe.prediction.signals import DefaultVectors, quasi_hidden, router_predict

__all__ = ["KINDS", "BundleError", "DefaultVectors", "EstimatorConfig", "ExpertEstimator", "NextLayerPredictor",
           "PredictorBundle", "find_bundle", "quasi_hidden", "router_predict"]
