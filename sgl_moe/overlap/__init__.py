"""Dual micro-batch attention–MoE overlap (seed 004 §3.3.1; FinDEP-style planning, seed 002 §3–4). Torch only.

- ``CostModel`` / ``measure`` (costs): per-layer attention and MoE time models, fitted from measurements.
- ``balanced_split`` (split): two contiguous micro-batches of equal cost, not equal count.
- ``Solver`` / ``Plan`` (solver): split point and order minimising the pipeline's makespan, cached by shape.
- ``DualBatchRunner`` (engine): runs a layer stack on the plan's micro-batches on a placement
  (``sequential``, ``streams``, ``cpu-experts``).
- ``LayerOps`` (layers): what a stack gives the runner; ``DecodeLayers`` / ``PrefillLayers`` are the benchmark stacks.
- ``python -m sgl_moe.overlap.bench``: the benchmark (no SGLang).
"""

from sgl_moe.overlap.costs import CostModel, Sample, measure
from sgl_moe.overlap.engine import PLACEMENTS, DependencyError, DualBatchRunner
from sgl_moe.overlap.layers import DecodeLayers, LayerOps, PrefillLayers
from sgl_moe.overlap.solver import Plan, Solver, two_resource_makespan
from sgl_moe.overlap.split import Split, balanced_split, count_split

__all__ = ["PLACEMENTS", "CostModel", "DecodeLayers", "DependencyError", "DualBatchRunner", "LayerOps", "Plan",
           "PrefillLayers", "Sample", "Solver", "Split", "balanced_split", "count_split", "measure",
           "two_resource_makespan"]
