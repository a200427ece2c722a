"""Which experts stay on the device for good: the most frequent ones, as many as hide the rest's copy.

The roofline rule (seed 001's reasoning applied to decode offload). A decode step activates on average
``n`` distinct experts per layer (``n = k`` at batch 1; ``expected_active_experts`` for batch B). With ``r``
of the E experts resident and activations assumed uniform over experts (conservative: residents are
chosen as the most frequent, which only helps), the expected host copy per layer is

    t_copy(r) = n · (E − r)/E · expert_bytes / link_bytes_per_s

and it hides under the layer's compute ``t_c`` when t_copy(r) ≤ t_c, i.e.

    r ≥ E − t_c · link · E / (n · expert_bytes),

capped by the device memory budget: r ≤ budget_bytes_per_layer / expert_bytes.

Worked example (physics.md, Qwen3-30B-A3B on an H100, batch-1 decode): expert_bytes = 9.44 MB,
link = 53 GB/s pinned PCIe, n = k = 8, E = 128. Copying 8 experts takes 1.42 ms. A batch-1 layer computes
in roughly t_c = 0.15 ms (physics.md: prefetch saves c/(c+t) ≈ 7–12%). Then t_c·link·E/(n·bytes) =
0.15e-3 · 53e9 · 128 / (8 · 9.44e6) = 13.5, so r ≥ 128 − 13.5 → r = 115 experts per layer (1.09 GB, i.e.
52 GB for 48 layers: nearly the whole model). With a 24 GB expert budget (0.5 GB per layer) the cap is
52 experts: the copy is then 8·76/128 = 4.75 experts ≈ 0.85 ms per layer, still ~6x the compute. Decode at
batch 1 is copy-bound; residency buys time linearly, prefetch hides at most min(copy, compute).
"""

from __future__ import annotations

import math

import torch


def choose_resident(freqs: torch.Tensor, count: int) -> dict[int, list[int]]:
    """The ``count`` most frequently activated experts of each layer (``freqs`` [L, E]), ids ascending.

    Ties go to the lower expert id (deterministic)."""
    if freqs.dim() != 2:
        raise ValueError(f"freqs must be [layers, experts], got shape {tuple(freqs.shape)}")
    num_layers, num_experts = freqs.shape
    if not 0 <= count <= num_experts:
        raise ValueError(f"resident count must be between 0 and {num_experts}, got {count}")
    out: dict[int, list[int]] = {}
    for layer in range(num_layers):
        # Stable sort on -freq keeps lower ids first among equal frequencies.
        order = torch.sort(-freqs[layer].double(), stable=True).indices[:count]
        out[layer] = sorted(int(e) for e in order)
    return out


def expected_active_experts(num_experts: int, top_k: int, batch: int) -> float:
    """Expected distinct experts per layer for ``batch`` tokens routed uniformly: E·(1 − (1 − k/E)^B)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def roofline_resident_count(expert_bytes: int, link_bytes_per_s: float, layer_compute_s: float,
                            experts_per_step: float, num_experts: int, budget_bytes_per_layer: int) -> int:
    """Smallest per-layer resident count whose expected host copy hides under the layer's compute, capped
    by the memory budget (see the module docstring for the formula and a worked example)."""
    if expert_bytes <= 0 or link_bytes_per_s <= 0 or num_experts < 1:
        raise ValueError("expert_bytes, link_bytes_per_s and num_experts must be positive")
    if layer_compute_s < 0 or experts_per_step < 0 or budget_bytes_per_layer < 0:
        raise ValueError("layer_compute_s, experts_per_step and budget_bytes_per_layer must not be negative")
    cap = min(num_experts, budget_bytes_per_layer // expert_bytes)
    if experts_per_step == 0:
        return 0
    hideable = layer_compute_s * link_bytes_per_s * num_experts / (experts_per_step * expert_bytes)
    # A small epsilon so that an exact fit (copy == compute) is not pushed up by rounding noise.
    needed = max(0, math.ceil(num_experts - hideable - 1e-9))
    return int(min(needed, cap))
