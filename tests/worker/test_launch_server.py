"""Launcher input handling: every bad input is one line on stderr and exit status 2, before SGLang starts."""

import json
import socket
import subprocess
import sys

import pytest

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.wire import PREDICTOR_DIR, RUNTIME_ENV_VAR
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.argv import ArgvView
from sgl_moe.worker.preflight import LaunchError
from sgl_moe.worker.preflight import with_defaults as _with_defaults
from sgl_moe.worker.runtime import export_runtime as _export_runtime


def with_defaults(argv):
    return list(_with_defaults(ArgvView(argv)))


def export_runtime(argv, moe, cpu_engine):
    return _export_runtime(ArgvView(argv), moe, cpu_engine)


def _launch(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "sgl_moe.launch_server", *args], capture_output=True, text=True,
                          timeout=timeout)


def _one_line_error(result, needle):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("sgl_moe.launch_server: error:")]
    assert len(lines) == 1 and needle in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_missing_model_path():
    _one_line_error(_launch("--model-path", "/nonexistent/model"), "does not exist")


def test_model_path_without_config(tmp_path):
    _one_line_error(_launch("--model-path", str(tmp_path)), "no config.json")


def test_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _one_line_error(_launch("--port", str(port)), "already in use")


@pytest.mark.parametrize("args,needle", [
    (["--moe-saturation-flops", "-5"], "--moe-saturation-flops must be positive"),
    (["--moe-saturation-margin", "0.5"], "--moe-saturation-margin"),
    (["--moe-saturation-flops", "lots"], "invalid float value: 'lots'"),
    (["--page-size", "0"], "--page-size must be a positive integer"),
    (["--kv-events-config", "{not json"], "not valid JSON"),
    (["--tp-size", "0"], "--tp-size must be a positive integer"),
    (["--port", "abc"], "--port must be a TCP port number"),
    (["--dp-size", "two"], "--dp-size must be a positive integer"),
    (["--max-running-requests", "-3"], "--max-running-requests must be a positive integer"),
    (["--moe-weight-streaming", "gather"], "standalone engine only"),
    (["--moe-weight-streaming", "hybrid"], "standalone engine only"),
    (["--moe-weight-streaming", "disk"], "invalid choice: 'disk'"),
    (["--moe-weight-streaming", "host", "--moe-stream-window", "0"], "--moe-stream-window must be at least 1"),
    (["--moe-weight-streaming", "host", "--ep-size", "2"], "cannot be combined with --ep-size 2"),
    (["--moe-expert-offload", "--moe-execution", "lazy"], "invalid choice: 'lazy'"),
    (["--moe-expert-offload", "--moe-predictor", "oracle"], "invalid choice: 'oracle'"),
    (["--moe-expert-offload", "--moe-resident-experts", "-1"], "--moe-resident-experts must be >= 0"),
    (["--moe-expert-offload", "--enable-two-batch-overlap"], "cannot be combined with --enable-two-batch-overlap"),
    (["--moe-dual-batch", "gpu"], "invalid choice: 'gpu'"),
    (["--moe-dual-batch", "streams", "--moe-expert-offload"], "cannot be combined with --moe-weight-streaming"),
    (["--moe-dual-batch", "streams", "--tp-size", "2"], "cannot be combined with --tp-size 2"),
    (["--moe-dual-batch", "streams", "--enable-two-batch-overlap"], "no all-to-all backend"),
    # SGLang's own check, made while it resolves arguments: one line, not a traceback from run_server.
    (["--prefill-only-disable-kv-cache"], "requires --is-embedding"),
])
def test_invalid_flag_values(args, needle):
    _one_line_error(_launch(*args), needle)


def test_unknown_flag_is_one_line_not_a_usage_dump():
    _one_line_error(_launch("--no-such-flag"), "unrecognized arguments: --no-such-flag")


def test_incompatible_device_on_a_cpu_machine():
    from sgl_moe import cpu_compat

    if cpu_compat.cuda_usable():
        pytest.skip("this machine has a CUDA device")
    _one_line_error(_launch("--device", "cuda"), "no CUDA device is usable")


def test_help_shows_sglang_and_moe_groups():
    result = _launch("--help")
    assert result.returncode == 0
    assert "SGLang server options" in result.stdout and "--model-path" in result.stdout
    assert "sgl_moe options (--moe-*)" in result.stdout and "--moe-saturation-flops" in result.stdout


def test_defaults_serve_the_shipped_model_with_pages_and_bound_events():
    argv = with_defaults([])
    assert argv[argv.index("--model-path") + 1] == str(DEFAULT_MODEL_DIR)
    assert argv[argv.index("--page-size") + 1] == "16"
    kv = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert kv["publisher"] == "zmq" and kv["bind"] is True and kv["endpoint"].startswith("tcp://127.0.0.1:")


def test_user_flags_win_over_defaults():
    argv = with_defaults(["--page-size=32", "--model-path", "/m", "--kv-events-config", "{}"])
    assert argv.count("--page-size") == 0 and "--page-size=32" in argv
    assert argv.count("--kv-events-config") == 1 and argv.count("--model-path") == 1


def test_neighbouring_workers_get_disjoint_event_ports():
    # Ports near 42000/43000 lie in Linux's ephemeral range, where any client socket may hold one for a
    # moment (the launcher then refuses, correctly): try a few neighbouring pairs.
    for base in range(41001, 41900, 37):
        try:
            kvs = [json.loads(with_defaults(["--port", str(p)])[-1]) for p in (base, base + 1)]
        except LaunchError:
            continue
        break
    else:
        pytest.fail("no pair of neighbouring ports had its KV-event ports free")
    ports = [kv[k] for kv in kvs for k in ("endpoint", "replay_endpoint")]
    assert ports == [f"tcp://127.0.0.1:{base + 1000}", f"tcp://127.0.0.1:{base + 2000}",
                     f"tcp://127.0.0.1:{base + 1001}", f"tcp://127.0.0.1:{base + 2001}"]


def test_the_distributed_rendezvous_port_is_the_workers_port_minus_1000_unless_given():
    argv = with_defaults(["--port", "25123"])
    assert argv[argv.index("--nccl-port") + 1] == "24123"
    given = with_defaults(["--port", "25123", "--nccl-port=25999"])
    assert "--nccl-port" not in given and "--nccl-port=25999" in given


def test_a_busy_rendezvous_port_is_one_line():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        held = s.getsockname()[1]
        if held + 1000 + 2000 > 65535:
            pytest.skip("the kernel gave a port too high to derive a worker port from")
        _one_line_error(_launch("--port", str(held + 1000)), f"port {held} (worker port - 1000")


def test_sglang_takes_the_launchers_rendezvous_port_not_its_own_draw(monkeypatch):
    """SGLang 0.5.23 with no --nccl-port draws one at random from 22,000-29,999 and once drew its own worker's
    KV-event replay port (the worker died binding it). Its draw forced onto the replay port: the port SGLang
    uses is still the launcher's."""
    from sglang.srt import server_args as sglang_args

    from sgl_moe.worker.platform import apply_platform

    port = 25123
    _, argv = apply_platform(ArgvView(with_defaults(["--port", str(port)])))
    monkeypatch.setattr(sglang_args, "get_free_port_below_ephemeral", lambda *a, **k: port + 2000)
    parsed = sglang_args.prepare_server_args(list(argv))
    assert sglang_args.PortArgs.init_new(parsed).nccl_port == port - 1000
    # The same draw without the launcher's flag lands on the replay port: the case this guards against.
    bare = sglang_args.prepare_server_args([a for a in argv if a not in ("--nccl-port", str(port - 1000))])
    assert sglang_args.PortArgs.init_new(bare).nccl_port == port + 2000


def test_streaming_on_a_gpu_refuses_cuda_graphs(monkeypatch):
    """On a GPU, per-layer buffer swaps and CUDA graphs cannot work together: refused before SGLang starts."""
    ENV_VAR = RUNTIME_ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(LaunchError, match="--disable-cuda-graph"):
        export_runtime(["--port", "30000"], MoeArgs(weight_streaming="host"), cpu_engine=False)
    profile_dir = export_runtime(["--disable-cuda-graph"], MoeArgs(weight_streaming="host", stream_window=3),
                                 cpu_engine=False)
    import os
    from dataclasses import asdict

    assert json.loads(os.environ[ENV_VAR]) == {"moe": asdict(MoeArgs(weight_streaming="host", stream_window=3)),
                                               "profile_dir": profile_dir}
    monkeypatch.delenv(ENV_VAR)
    assert export_runtime([], MoeArgs(), cpu_engine=True) is None and ENV_VAR not in os.environ


def test_offload_without_a_predictor_bundle_is_refused_in_one_line(tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model, ignore=shutil.ignore_patterns("expert_predictor"))
    _one_line_error(_launch("--model-path", str(model), "--moe-expert-offload"),
                    "python -m sgl_moe.prediction.train --model")


def test_offload_implies_host_streaming_for_prefill(monkeypatch):
    from sgl_moe.patches.runtime_env import RuntimeConfig

    ENV_VAR = RUNTIME_ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(LaunchError, match="--moe-expert-offload .*--disable-cuda-graph"):
        export_runtime([], MoeArgs(expert_offload=True), cpu_engine=False)
    export_runtime(["--model-path", str(DEFAULT_MODEL_DIR)],
                   MoeArgs(expert_offload=True, execution="speculative", resident_experts=3), cpu_engine=True)
    cfg = RuntimeConfig.from_env()
    assert cfg.weight_streaming == "host" and cfg.moe.expert_offload and cfg.moe.execution == "speculative"
    assert cfg.moe.resident_experts == 3 and cfg.moe.predictor == "hybrid"


def test_the_launcher_looks_for_the_bundle_where_training_saves_it():
    from sgl_moe.prediction import bundle

    assert bundle.find_bundle(DEFAULT_MODEL_DIR) == DEFAULT_MODEL_DIR / PREDICTOR_DIR


def test_dual_batch_refuses_attention_backends_that_plan_per_batch(monkeypatch):
    from sgl_moe.patches.runtime_env import RuntimeConfig

    ENV_VAR = RUNTIME_ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)
    for argv in ([], ["--attention-backend", "flashinfer"]):  # a GPU's default backend, or a named one
        with pytest.raises(LaunchError, match="one child backend per micro-batch"):
            export_runtime(argv, MoeArgs(dual_batch="streams"), cpu_engine=False)
    with pytest.raises(LaunchError, match="add --disable-cuda-graph"):  # a GPU decodes through CUDA graphs
        export_runtime(["--attention-backend", "torch_native"], MoeArgs(dual_batch="streams"), cpu_engine=False)
    export_runtime(["--attention-backend", "torch_native", "--disable-cuda-graph"], MoeArgs(dual_batch="streams"),
                   cpu_engine=False)
    assert RuntimeConfig.from_env().moe.dual_batch == "streams"
