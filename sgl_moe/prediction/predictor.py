"""Next-layer expert prediction at inference time: layer l's residual and routing -> layer l+1's routing.

Shapes: T tokens, H hidden, E experts, k experts per token.

Kinds (seed 003 §3, §6.3):
    router     layer l+1's own gate on the quasi-hidden state q_l (parameter-free)
    estimator  the learned estimator on q_l, at every layer
    hybrid     the estimator on the target layers in bundle.hybrid_layers, the router elsewhere
"""

from __future__ import annotations

from typing import Literal

import torch

from sgl_moe.prediction.bundle import PredictorBundle
from sgl_moe.prediction.estimator import ExpertEstimator
from sgl_moe.prediction.signals import DefaultVectors, quasi_hidden, router_predict
from sgl_moe.streaming.moe_math import route

Kind = Literal["router", "estimator", "hybrid"]
KINDS: tuple[str, ...] = ("router", "estimator", "hybrid")


class NextLayerPredictor:
    """Predicts layer l+1's (weights, ids) from layer l's post-attention residual and true top-k routing."""

    def __init__(self, bundle: PredictorBundle, gate_weights: list[torch.Tensor],
                 next_norm_weights: list[torch.Tensor], eps: float, top_k: int, kind: Kind,
                 renormalize: bool = True):
        if kind not in KINDS:
            raise ValueError(f"unknown prediction kind {kind!r}; choose one of {KINDS}")
        num_layers = len(gate_weights)
        if len(next_norm_weights) != num_layers:
            raise ValueError(f"{num_layers} gate weights but {len(next_norm_weights)} norm weights")
        if bundle.num_layers != num_layers:
            raise ValueError(f"bundle has default vectors for {bundle.num_layers} layers, model has {num_layers}")
        if kind == "estimator" or (kind == "hybrid" and bundle.hybrid_layers):
            if bundle.estimator is None:
                raise ValueError(f"prediction kind {kind!r} needs an estimator; this bundle has none")
        self.bundle = bundle
        self.kind: Kind = kind
        self.eps = eps
        self.top_k = top_k
        self.renormalize = renormalize
        self.num_layers = num_layers
        self._gate_weights = gate_weights
        self._norm_weights = next_norm_weights
        self._device: torch.device | None = None
        self._defaults: DefaultVectors | None = None
        self._gates: list[torch.Tensor] = []
        self._norms: list[torch.Tensor] = []
        self._estimator: ExpertEstimator | None = None

    def uses_estimator(self, target_layer: int) -> bool:
        return self.kind == "estimator" or (self.kind == "hybrid" and target_layer in self.bundle.hybrid_layers)

    def _to(self, device: torch.device) -> None:
        """Move every tensor the prediction reads to ``device`` once (fp32 copies); later calls reuse them."""
        if self._device == device:
            return
        self._defaults = DefaultVectors(self.bundle.defaults.vectors.to(device, torch.float32))
        self._gates = [w.detach().to(device, torch.float32) for w in self._gate_weights]
        self._norms = [w.detach().to(device, torch.float32) for w in self._norm_weights]
        if self.bundle.estimator is not None:
            # A private copy: moving the bundle's own module would change it under other predictors.
            est = ExpertEstimator(self.bundle.estimator.cfg)
            est.load_state_dict(self.bundle.estimator.state_dict())
            self._estimator = est.to(device).eval().requires_grad_(False)
        self._device = device

    @torch.no_grad()
    def predict(self, layer: int, residual: torch.Tensor, weights: torch.Tensor,
                ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing of layer+1 from residual r_l [T, H] and layer l's routing weights, ids [T, k].

        Returns (weights [T, k] float32, ids [T, k] int64) on the residual's device.
        """
        if not 0 <= layer < self.num_layers - 1:
            raise ValueError(f"cannot predict past layer {layer}: predictions exist for layers "
                             f"0..{self.num_layers - 2} (the last layer has no next layer)")
        self._to(residual.device)
        assert self._defaults is not None
        target = layer + 1
        default = self._defaults.layer_default(layer, weights, ids)  # [T, H]
        q = quasi_hidden(residual, default, self._norms[target], self.eps)  # [T, H]
        if self.uses_estimator(target):
            assert self._estimator is not None
            pred_w, pred_ids = route(self._estimator(q, layer), self.top_k, self.renormalize)
        else:
            pred_w, pred_ids = router_predict(q, self._gates[target], self.top_k, self.renormalize)
        return pred_w.float(), pred_ids.long()
