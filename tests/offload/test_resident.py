"""Resident expert choice (most frequent per layer) and the roofline rule for how many."""

import pytest
import torch

from sgl_moe.offload import choose_resident, expected_active_experts, roofline_resident_count

QWEN3_30B_EXPERT = 9_437_184  # 3 · 2048 · 768 · 2 bytes (physics.md: 9.44 MB)
PCIE = 53e9


def test_choose_resident_takes_the_most_frequent_per_layer():
    freqs = torch.tensor([[5, 1, 9, 3], [0, 7, 7, 2]])
    assert choose_resident(freqs, 2) == {0: [0, 2], 1: [1, 2]}
    assert choose_resident(torch.tensor([[1, 1, 1, 1]]), 2) == {0: [0, 1]}  # ties: lower ids
    assert choose_resident(freqs, 0) == {0: [], 1: []}
    with pytest.raises(ValueError, match="between 0 and 4"):
        choose_resident(freqs, 5)


def test_worked_example_from_the_docstring():
    """Qwen3-30B-A3B on an H100 at batch 1: hiding 8 experts' copy under 0.15 ms of compute needs 115 of 128
    resident; a 0.5 GB per-layer budget caps it at 52."""
    common = dict(expert_bytes=QWEN3_30B_EXPERT, link_bytes_per_s=PCIE, layer_compute_s=0.15e-3,
                  experts_per_step=8, num_experts=128)
    assert roofline_resident_count(**common, budget_bytes_per_layer=10**12) == 115
    assert roofline_resident_count(**common, budget_bytes_per_layer=500_000_000) == 52


def test_roofline_edges():
    e = QWEN3_30B_EXPERT
    copy_8 = 8 * e / PCIE  # 1.42 ms
    # Compute as long as the whole copy: nothing needs to be resident.
    assert roofline_resident_count(e, PCIE, copy_8, 8, 128, 10**12) == 0
    # Half the copy time: half the experts' traffic must go, i.e. 64 resident.
    assert roofline_resident_count(e, PCIE, copy_8 / 2, 8, 128, 10**12) == 64
    # No compute to hide behind: everything resident, unless the budget says otherwise.
    assert roofline_resident_count(e, PCIE, 0.0, 8, 128, 10**12) == 128
    assert roofline_resident_count(e, PCIE, 0.0, 8, 128, 3 * e) == 3
    assert roofline_resident_count(e, PCIE, 0.0, 0, 128, 10**12) == 0
    with pytest.raises(ValueError):
        roofline_resident_count(0, PCIE, 1e-3, 8, 128, 10**12)


def test_expected_active_experts():
    assert expected_active_experts(128, 8, 1) == pytest.approx(8)
    assert 8 < expected_active_experts(128, 8, 8) < 64
    assert expected_active_experts(128, 8, 256) == pytest.approx(128, rel=1e-6)
