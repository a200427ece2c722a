"""The bench model's directory (config and the shipped tokenizer) and the step-time fit; a worker serving it is in
``tests/live/test_bench_model_live.py``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.policy_bench.bench_model import (
    TOKENIZER_FILES,
    BenchModelShape,
    fit,
    model_args,
    worker_args,
    write_bench_model,
)


def test_the_directory_holds_the_shape_and_the_shipped_tokenizer_and_is_written_once(tmp_path):
    path = write_bench_model(root=tmp_path)
    config = AutoConfig.from_pretrained(path)
    shape = BenchModelShape()
    assert config.model_type == "qwen3_moe" and config.hidden_size == shape.hidden_size
    assert config.num_hidden_layers == shape.num_hidden_layers and config.num_experts == shape.num_experts
    assert config.num_experts_per_tok == shape.num_experts_per_tok
    shipped = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    assert config.vocab_size == shipped["vocab_size"]  # the same token ids as every stream and fixture
    for name in TOKENIZER_FILES:
        assert (path / name).read_bytes() == (DEFAULT_MODEL_DIR / name).read_bytes(), name
    assert not list(path.glob("*.safetensors"))  # weights come from --load-format dummy
    stamp = (path / "config.json").stat().st_mtime_ns
    assert write_bench_model(root=tmp_path) == path and (path / "config.json").stat().st_mtime_ns == stamp
    other = write_bench_model(BenchModelShape(num_experts=8), root=tmp_path)
    assert other != path and AutoConfig.from_pretrained(other).num_experts == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, other.name])  # no temporary left
    assert worker_args(path) == ["--model-path", str(path), "--load-format", "dummy"]


def test_the_fit_recovers_a_line_and_says_the_fixed_share():
    points = [(1, 64, 0.05 + 64e-4), (2, 512, 0.05 + 512e-4), (4, 1024, 0.05 + 1024e-4)]
    f = fit(points)
    assert f.fixed_s == pytest.approx(0.05) and f.per_token_s == pytest.approx(1e-4)
    assert f.fixed_share(500) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        fit([(1, 64, 0.1), (2, 64, 0.2)])


def test_a_benchmarks_model_flag_names_the_launcher_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("SGL_MOE_CACHE", str(tmp_path))
    assert model_args("shipped") == []  # the launcher's default model
    assert model_args("bench") == worker_args(write_bench_model(root=tmp_path))
    with pytest.raises(ValueError, match="unknown model"):
        model_args("huge")


def test_the_command_writes_the_directory_and_prints_its_path_and_refuses_a_bad_shape(tmp_path):
    env = {**os.environ, "SGL_MOE_CACHE": str(tmp_path)}
    cmd = [sys.executable, "-m", "sgl_moe.policy_bench.bench_model"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == write_bench_model(root=tmp_path)
    bad = subprocess.run([*cmd, "--shape", "hidden_size=wide"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--shape" in bad.stderr and "Traceback" not in bad.stderr
    unknown = subprocess.run([*cmd, "--shape", "depth=3"], env=env, capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "depth" in unknown.stderr and "Traceback" not in unknown.stderr
