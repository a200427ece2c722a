"""Every command the README names answers ``--help`` with its usage (a ``%`` in a flag's docstring once made
argparse raise instead: help text is a format string)."""

import subprocess
import sys

import pytest

COMMANDS = ["sgl_moe.router", "sgl_moe.classify", "sgl_moe.policy_bench", "sgl_moe.simulator", "sgl_moe.workloads",
            "sgl_moe.streaming.bench", "sgl_moe.offload.bench", "sgl_moe.overlap.bench", "sgl_moe.simulator.fit_timing"]


@pytest.mark.parametrize("module", COMMANDS)
def test_help_renders(module):
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_router_help_lists_every_flag_with_a_percent_sign_intact():
    from sgl_moe.router.config import RouterConfig

    text = RouterConfig.parser().format_help()
    assert "--prefix-wait-s" in text
    assert "%" in text  # a docstring's literal percent survives (escaped for argparse, printed once)
