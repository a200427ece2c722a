"""Θ by Eq. 3 of seed 000 (App. B.4) from a profile's per-layer timings."""

import pytest

from sgl_moe import saturation
from sgl_moe.saturation import CalibrationError


def _layers(walls, waits=None):
    waits = waits or [0.0] * len(walls)
    return [{"layer": i, "wall_s": w, "wait_s": t} for i, (w, t) in enumerate(zip(walls, waits))]


def test_transfers_hidden_gives_margin_times_reference_flops():
    theta = saturation.calibrated(_layers([0.10, 0.09, 0.10]), f_ref=1e12, tokens=4096, margin=1.2)
    assert theta.flops == pytest.approx(1.2e12) and theta.state == "calibrated"
    assert theta.details["ratio"] == 1.0


def test_slowest_transfer_scales_theta_by_its_ratio_to_first_layer_compute():
    # Layer 2 waited 0.2 s for its experts: its envelope is 0.3 s against 0.1 s of pure compute.
    theta = saturation.calibrated(_layers([0.10, 0.12, 0.30], [0.0, 0.02, 0.2]), f_ref=1e12, tokens=8192, margin=1.0)
    assert theta.flops == pytest.approx(3e12)
    assert theta.details["slowest_layer"] == 2 and theta.details["profile_tokens"] == 8192


def test_first_layer_compute_excludes_its_wait():
    theta = saturation.calibrated(_layers([0.2, 0.2], [0.1, 0.0]), f_ref=1.0, tokens=1, margin=1.0)
    assert theta.details["t0_s"] == pytest.approx(0.1) and theta.flops == pytest.approx(2.0)


@pytest.mark.parametrize("layers", [[], _layers([0.1], [0.1])])
def test_unusable_profiles_are_refused(layers):
    with pytest.raises(CalibrationError):
        saturation.calibrated(layers, f_ref=1.0, tokens=1, margin=1.0)


def test_fixed_and_manual():
    fixed = saturation.without_transfer(5e11, 4096, 1.5)
    assert fixed.flops == pytest.approx(7.5e11) and fixed.state == "fixed" and "4096-token" in fixed.source
    manual = saturation.manual(3e9)
    assert manual.to_dict() == {"flops": 3e9, "source": "manual (--moe-saturation-flops)", "state": "manual"}


def test_request_overhead_beyond_a_plausible_size_is_noise():
    """Timings 0.1% apart (noise on a loaded host) give no overhead rather than a huge one: a / b blows up as the
    two times meet (a profile run into traffic once published 1,500 x its prompt's FLOPs per request)."""
    f_long, f_short = 3e8, 4e7
    assert saturation.request_overhead((f_long, 0.01001), (f_short, 0.010)) is None
    measured = saturation.request_overhead((f_long, 0.012), (f_short, 0.0057))  # the shipped model at 8 in flight
    assert measured is not None and 0 < measured < 2 * f_long
    # Fixed cost four times the compute of the longer request: a real figure, kept.
    assert saturation.request_overhead((f_long, 5e-3), (f_short, 4e-3 + 1e-3 * f_short / f_long)) == \
        pytest.approx(4 * f_long)
