"""Gather and hybrid modes over two gloo ranks give the same layer outputs as fully resident weights."""

from __future__ import annotations

import pytest

from sgl_moe.streaming.ranks import run_ranks
from sgl_moe.streaming.selfcheck import check_rank


@pytest.mark.parametrize("window,first_resident", [(1, True), (2, True), (3, False)])
def test_gather_and_hybrid_match_resident_weights(window, first_resident):
    layers = 5
    results = run_ranks(check_rank, 2, ["gather", "hybrid"], window, first_resident, "cpu", layers)
    for rank, out in enumerate(results):
        for mode, r in out.items():
            assert r["first_equal"] and r["second_equal"], f"rank {rank} mode {mode}: outputs differ from resident"
            streamed = layers - int(first_resident)
            assert r["loads"] >= 2 * streamed and r["restarts"] == 0, (mode, r)
            lb = r["layer_bytes"]
            # Resident first layer + window slots, plus this rank's half of each streamed layer (gather) or
            # two half-layer staging buffers (hybrid).
            expected = (int(first_resident) + window) * lb + (streamed * lb // 2 if mode == "gather" else lb)
            assert r["device_expert_bytes"] == expected, (mode, r["device_expert_bytes"], expected)
