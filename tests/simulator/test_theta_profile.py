"""Simulated workers report the Θ a live worker measures: its start-up throughput profile, run on the timing model."""

from dataclasses import replace

from sgl_moe import saturation
from sgl_moe.simulator import SimConfig, Simulation, h100_30b
from sgl_moe.simulator.timing_model import profiled_theta
from sgl_moe.worker.theta_calibration import PROFILE_PROMPT_TOKENS


def rate(cal, c):
    return c * cal.flops.request_flops(0, PROFILE_PROMPT_TOKENS) / cal.step_seconds(c, PROFILE_PROMPT_TOKENS)


def test_theta_is_the_fewest_prompts_in_flight_reaching_the_knee():
    cal = h100_30b()
    th = profiled_theta(cal)
    c = round(th.flops / cal.flops.request_flops(0, PROFILE_PROMPT_TOKENS))
    best = max(rate(cal, k) for k in (1, 2, 4, 8, 16, 32))
    assert c == th.details["saturation_batch"] and c in (1, 2, 4, 8, 16, 32)
    assert rate(cal, c) >= saturation.KNEE_FRACTION * best > rate(cal, c // 2)
    assert th.flops < cal.flops.request_flops(0, cal.step_tokens) / 4  # far below one full step


def test_a_larger_fixed_step_cost_moves_the_knee_up_and_a_transfer_to_hide_too():
    cal = h100_30b()
    base = profiled_theta(cal).flops
    assert profiled_theta(replace(cal, step_s=cal.step_s * 8)).flops > base
    assert profiled_theta(cal, cal.transfer_s("nvlink")).flops > base


def test_the_simulation_uses_the_profiled_theta_unless_given_one():
    cal = h100_30b()
    assert Simulation(SimConfig(workers=2), cal, []).theta == profiled_theta(cal).flops
    nvlink = Simulation(SimConfig(workers=2, transfer="nvlink"), cal, []).theta
    assert nvlink == profiled_theta(cal, cal.transfer_s("nvlink")).flops
    assert Simulation(SimConfig(workers=2, theta_flops=5e12), cal, []).theta == 5e12
    assert Simulation(SimConfig(workers=2), replace(cal, theta_flops=7e12), []).theta == 7e12
