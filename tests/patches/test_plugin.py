"""The plugin is inert unless the launcher turned a patch on: SGLang started any other way runs untouched."""

import json
import os
import subprocess
import sys

import pytest

from sgl_moe.patches.runtime_env import ENV_VAR, RuntimeConfig
from sgl_moe.worker.args import MoeArgs

CONFIGS = {
    "unset": None,
    "defaults": RuntimeConfig(MoeArgs()).to_env(),
    "host streaming": RuntimeConfig(MoeArgs(weight_streaming="host", stream_window=2)).to_env(),
    "expert offload": RuntimeConfig(MoeArgs(expert_offload=True)).to_env(),
    "dual batch": RuntimeConfig(MoeArgs(dual_batch="cpu-experts")).to_env(),
}
"""The plugin's environment variable in each case (None: not set)."""

PROBE = """
import json, os, sys, traceback
from sglang.srt.plugins.hook_registry import HookRegistry  # ~10 s of imports: once, not once per case

for name, value in json.loads(sys.argv[1]).items():
    pid = os.fork()
    if pid == 0:
        # Each case in a child of its own: a fresh import of the plugin and an empty registry, as in a process
        # started with that environment (the plugin reads the variable when it registers).
        try:
            if value is None:
                os.environ.pop(ENV_VAR, None)
            else:
                os.environ[ENV_VAR] = value
            from sgl_moe.patches import plugin
            plugin.register()
            hooks = sorted(HookRegistry._hooks)
            owners = sorted(h.__module__ for hs in HookRegistry._hooks.values() for _, h, _ in hs)
            print("CASE " + json.dumps([name, str(hooks), str(owners)]), flush=True)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    if os.waitpid(pid, 0)[1] != 0:
        sys.exit(f"case {name!r} failed")
"""


@pytest.fixture(scope="module")
def registered() -> dict[str, tuple[str, str]]:
    """Each case's registered hooks and the modules that own them, both as printed sorted lists."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    out = subprocess.run([sys.executable, "-c", f"ENV_VAR = {ENV_VAR!r}\n" + PROBE, json.dumps(CONFIGS)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    cases = {name: (hooks, owners) for line in out.stdout.splitlines() if line.startswith("CASE ")
             for name, hooks, owners in [json.loads(line[len("CASE "):])]}
    assert set(cases) == set(CONFIGS), out.stdout[-2000:]
    return cases


def test_no_configuration_registers_nothing(registered):
    assert registered["unset"][0] == "[]"
    assert registered["defaults"][0] == "[]"


def test_host_streaming_registers_the_two_hooks(registered):
    hooks, _ = registered["host streaming"]
    assert "FusedMoE.run_moe_core" in hooks and "ModelRunner.load_model" in hooks


def test_expert_offload_registers_its_own_hooks_in_place_of_streamings(registered):
    hooks, owners = registered["expert offload"]
    assert "FusedMoE.run_moe_core" in hooks and "ModelRunner.load_model" in hooks
    assert "expert_offload" in owners


def test_dual_batch_registers_the_model_forward_hook(registered):
    hooks, owners = registered["dual batch"]
    assert "Qwen2MoeModel.forward" in hooks and "ModelRunner.load_model" in hooks
    assert "FusedMoE.run_moe_core" not in hooks  # streaming/offload are off
    assert set(owners.strip("[]").replace("'", "").split(", ")) == {"sgl_moe.patches.dual_batch"}


def test_the_plugin_is_registered_under_sglangs_entry_point_group():
    from importlib.metadata import entry_points

    [ep] = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "sgl_moe"]
    assert ep.value == "sgl_moe.patches.plugin:register"
