"""The plugin is inert unless the launcher turned a patch on: SGLang started any other way runs untouched."""

import subprocess
import sys

from sgl_moe.patches.runtime_env import ENV_VAR, RuntimeConfig
from sgl_moe.worker.args import MoeArgs


def _registered_hooks(env_value: str | None) -> str:
    code = (
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "from sgl_moe.patches import plugin\n"
        "plugin.register()\n"
        "print(sorted(HookRegistry._hooks))\n"
    )
    import os

    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if env_value is not None:
        env[ENV_VAR] = env_value
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_no_configuration_registers_nothing():
    assert _registered_hooks(None) == "[]"
    assert _registered_hooks(RuntimeConfig(MoeArgs()).to_env()) == "[]"


def test_host_streaming_registers_the_two_hooks():
    hooks = _registered_hooks(RuntimeConfig(MoeArgs(weight_streaming="host", stream_window=2)).to_env())
    assert "FusedMoE.run_moe_core" in hooks and "ModelRunner.load_model" in hooks


def test_expert_offload_registers_its_own_hooks_in_place_of_streamings():
    code_env = RuntimeConfig(MoeArgs(expert_offload=True)).to_env()
    hooks = _registered_hooks(code_env)
    assert "FusedMoE.run_moe_core" in hooks and "ModelRunner.load_model" in hooks
    assert "expert_offload" in _hook_owner(code_env)


def test_dual_batch_registers_the_model_forward_hook():
    env = RuntimeConfig(MoeArgs(dual_batch="cpu-experts")).to_env()
    hooks = _registered_hooks(env)
    assert "Qwen2MoeModel.forward" in hooks and "ModelRunner.load_model" in hooks
    assert "FusedMoE.run_moe_core" not in hooks  # streaming/offload are off
    assert set(_hook_owner(env).strip("[]").replace("'", "").split(", ")) == {"sgl_moe.patches.dual_batch"}


def _hook_owner(env_value: str) -> str:
    import os

    code = ("from sglang.srt.plugins.hook_registry import HookRegistry\n"
            "from sgl_moe.patches import plugin\n"
            "plugin.register()\n"
            "print(sorted(h.__module__ for hs in HookRegistry._hooks.values() for _, h, _ in hs))\n")
    env = {**os.environ, ENV_VAR: env_value}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_plugin_is_registered_under_sglangs_entry_point_group():
    from importlib.metadata import entry_points

    [ep] = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "sgl_moe"]
    assert ep.value == "sgl_moe.patches.plugin:register"
