"""``python -m sgl_moe.launch_server``: SGLang's HTTP server with sgl_moe's defaults, flags and endpoints.

Accepts every SGLang server flag plus the ``--moe-*`` flags. With no arguments it serves the shipped
model on 127.0.0.1 with page size 16, prefix caching on and KV-cache events published on a bound
loopback ZMQ endpoint; on a machine without a usable CUDA device it selects SGLang's CPU engine
through ``sgl_moe.cpu_compat``. Bad input fails fast with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.moe_args import MoeArgs, MoeArgsError

logger = logging.getLogger("sgl_moe.launch_server")

DEFAULT_PAGE_SIZE = 16
CPU_DEFAULT_MAX_TOTAL_TOKENS = 131072
"""KV pool cap on CPU, so several workers fit in a small machine's memory."""
CPU_DEFAULT_MEM_FRACTION = 0.5
"""On CPU SGLang requires the RAM still free after loading the weights to exceed (1 - fraction) x the RAM free
before; other workers loading at the same moment count against it. 0.05 made the third of three workers
started together fail ("Loaded weights leave no GPU memory for the KV cache"); the KV pool itself stays
capped by ``--max-total-tokens``."""


class LaunchError(Exception):
    """Bad input detected before SGLang starts; printed as one line."""


POSITIVE_INT_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--tp-size", "--tensor-parallel-size"), ("--dp-size", "--data-parallel-size"),
    ("--pp-size", "--pipeline-parallel-size"), ("--ep-size", "--expert-parallel-size"),
    ("--max-running-requests",), ("--max-total-tokens",), ("--max-prefill-tokens",), ("--context-length",),
    ("--page-size",),
)
"""Sizes SGLang 0.5.23 accepts unchecked and then crashes (tp 0) or hangs (max-running-requests -3) on."""


class _OneLineArgumentParser(argparse.ArgumentParser):
    """Argparse errors become LaunchError (one line) instead of a usage dump of SGLang's ~400 flags."""

    def error(self, message: str):
        raise LaunchError(f"{message} (see --help)")


def _flag_value(argv: list[str], *names: str) -> str | None:
    """The value given for a flag (``--f v`` or ``--f=v``); None if absent. Last occurrence wins."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def _has_flag(argv: list[str], *names: str) -> bool:
    return any(a == n or a.startswith(n + "=") for a in argv for n in names)


def _port_free(host: str, port: int) -> bool:
    bind_host = "0.0.0.0" if host in ("*", "0.0.0.0", "") else host
    with socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError:
            return False
    return True


KV_EVENTS_PORT_OFFSET = 1000
REPLAY_PORT_OFFSET = 2000


def _event_ports(host: str, port: int, dp: int) -> tuple[int, int]:
    """KV-event and replay ports derived from the worker's own port alone (port + 1000, port + 2000, plus the
    DP rank), so workers on neighbouring ports started at the same moment never pick the same ones."""
    events, replay = port + KV_EVENTS_PORT_OFFSET, port + REPLAY_PORT_OFFSET
    if replay + dp > 65535:
        raise LaunchError(f"--port {port} leaves no room for the KV-event ports (port + {KV_EVENTS_PORT_OFFSET} "
                          f"and + {REPLAY_PORT_OFFSET}); use a lower port or pass --kv-events-config")
    busy = [p for base in (events, replay) for p in range(base, base + dp) if not _port_free(host, p)]
    if busy:
        raise LaunchError(f"KV-event port(s) {', '.join(map(str, busy))} (worker port + {KV_EVENTS_PORT_OFFSET} / "
                          f"+ {REPLAY_PORT_OFFSET}) are in use; pick another --port or pass --kv-events-config")
    return events, replay


def check_model_path(model_path: str) -> None:
    p = Path(model_path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise LaunchError(f"model path {model_path} is not a directory")
        if not (p / "config.json").is_file():
            raise LaunchError(f"model path {model_path} has no config.json: not a Hugging Face model directory")
        return
    looks_local = model_path.startswith(("/", ".", "~")) or model_path.count("/") != 1
    if looks_local:
        raise LaunchError(f"model path {model_path} does not exist")


def with_defaults(argv: list[str]) -> list[str]:
    """SGLang argv with the project's defaults added where the user gave none."""
    argv = list(argv)
    if not _has_flag(argv, "--model-path", "--model"):
        argv += ["--model-path", str(DEFAULT_MODEL_DIR)]
    if not _has_flag(argv, "--page-size"):
        argv += ["--page-size", str(DEFAULT_PAGE_SIZE)]
    if not _has_flag(argv, "--kv-events-config"):
        host = _flag_value(argv, "--host") or "127.0.0.1"
        port = int(_flag_value(argv, "--port") or 30000)
        dp = int(_flag_value(argv, "--dp-size", "--data-parallel-size") or 1)
        pub_host = "127.0.0.1" if host in ("127.0.0.1", "localhost") else "*"
        events, replay = _event_ports(host, port, dp)
        argv += ["--kv-events-config", json.dumps({
            "publisher": "zmq", "bind": True, "topic": "kv",
            "endpoint": f"tcp://{pub_host}:{events}", "replay_endpoint": f"tcp://{pub_host}:{replay}",
        })]
    return argv


def check_values(argv: list[str]) -> None:
    """Syntax of the values the launcher itself reads (before it derives defaults from them)."""
    port_text = _flag_value(argv, "--port") or "30000"
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise LaunchError(f"--port must be a TCP port number, got {port_text!r}")
    for names in POSITIVE_INT_FLAGS:
        value = _flag_value(argv, *names)
        if value is not None and not (value.isdigit() and int(value) >= 1):
            raise LaunchError(f"{names[0]} must be a positive integer, got {value!r}")


def preflight(argv: list[str]) -> None:
    """Checks against this machine that need no SGLang import: model path, ports, KV-events config."""
    check_model_path(_flag_value(argv, "--model-path", "--model") or "")
    host = _flag_value(argv, "--host") or "127.0.0.1"
    port = _flag_value(argv, "--port") or "30000"
    if not _port_free(host, int(port)):
        raise LaunchError(f"port {port} on {host} is already in use; pick another with --port")
    kv = _flag_value(argv, "--kv-events-config")
    if kv is not None:
        try:
            cfg = json.loads(kv)
        except json.JSONDecodeError as exc:
            raise LaunchError(f"--kv-events-config is not valid JSON: {exc}") from None
        if not isinstance(cfg, dict):
            raise LaunchError("--kv-events-config must be a JSON object")
        endpoint = str(cfg.get("endpoint", ""))
        if cfg.get("publisher") == "zmq" and endpoint.startswith("tcp://") and cfg.get("bind") is not False:
            ep_host, _, ep_port = endpoint[len("tcp://"):].rpartition(":")
            if ep_port.isdigit() and not _port_free(ep_host, int(ep_port)):
                raise LaunchError(f"KV-events endpoint {endpoint} is already in use")
    if _has_flag(argv, "--disable-radix-cache"):
        logger.warning("--disable-radix-cache: prefix caching is off, so no KV events and no prefix reuse")


def apply_platform(argv: list[str]):
    """Probe CUDA / sgl_kernel, make the CPU compatibility layer effective if needed, adjust argv."""
    from sgl_moe import cpu_compat

    plan = cpu_compat.probe()
    argv = list(argv)
    if plan.cpu_engine:
        # What the CPU engine requires (from the plan): refuse a conflicting choice, else add it.
        for dest, value in plan.required_server_args.items():
            flag = "--" + dest.replace("_", "-")
            if value is True:
                if not _has_flag(argv, flag):
                    argv.append(flag)
                continue
            given = _flag_value(argv, flag)
            if given is None:
                argv += [flag, str(value)]
            elif given != str(value):
                raise LaunchError(f"{flag} {given} was requested but no CUDA device is usable on this machine; "
                                  f"the CPU engine needs {flag} {value}")
        # Defaults the user may override.
        if not _has_flag(argv, "--dtype"):
            # SGLang maps a float32 checkpoint to float16 under "auto"; on a CPU float32 is both the
            # fast and the exact choice.
            argv += ["--dtype", "float32"]
        if not _has_flag(argv, "--max-total-tokens"):
            argv += ["--max-total-tokens", str(CPU_DEFAULT_MAX_TOTAL_TOKENS)]
        if not _has_flag(argv, "--mem-fraction-static"):
            argv += ["--mem-fraction-static", str(CPU_DEFAULT_MEM_FRACTION)]
        if not _has_flag(argv, "--sleep-on-idle"):
            # An idle scheduler otherwise polls at full speed: ~75% of a core each, which starves the
            # other workers and the router on a small CPU machine.
            argv += ["--sleep-on-idle"]
    plan.apply()
    logger.info("platform: %s", plan.reason)
    return plan, argv


def build_parser(with_sglang: bool) -> argparse.ArgumentParser:
    parser = _OneLineArgumentParser(
        prog="python -m sgl_moe.launch_server", allow_abbrev=False,
        description="SGLang server with sgl_moe's defaults (shipped model, page size 16, KV events on "
                    "loopback, CPU engine when no GPU) and its --moe-* options.",
    )
    if with_sglang:
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import ServerArgs

        load_plugins()  # plugins may add server flags (in every SGLang process, as SGLang's own launcher does)

        ServerArgs.add_cli_args(parser.add_argument_group("SGLang server options"))
    MoeArgs.add_cli_args(parser)
    return parser


PREDICTOR_DIR = "expert_predictor"
"""Where ``python -m sgl_moe.prediction.train`` saves a model's predictor (kept equal to
``sgl_moe.prediction.bundle``'s name by a test; not imported here, that module needs torch)."""


def check_predictor_bundle(model_path: str | None) -> None:
    """Expert prediction needs the model's trained bundle (default vectors, estimator): refuse early, in one line."""
    if model_path is None or not Path(model_path).is_dir():
        return  # a hub id: the worker looks for the bundle in its snapshot and says so if absent
    if not (Path(model_path) / PREDICTOR_DIR).is_dir():
        raise LaunchError(f"--moe-expert-offload predicts the next layer's experts from {model_path}/{PREDICTOR_DIR}, "
                          f"which does not exist; train it with `python -m sgl_moe.prediction.train --model "
                          f"{model_path}`, or use --moe-execution on_demand (no prediction)")


def export_dual_batch(argv: list[str], moe: MoeArgs, cpu_engine: bool) -> str:
    """``--moe-dual-batch``: refuse what cannot work, then hand the patch its configuration. Returns the
    directory where the patch leaves its counts for ``/sgl_moe/info``."""
    from sgl_moe.patches.runtime_env import RuntimeConfig

    backend = _flag_value(argv, "--attention-backend")
    if not (backend == "torch_native" or (backend is None and cpu_engine)):
        raise LaunchError(f"--moe-dual-batch {moe.dual_batch} runs attention per micro-batch, which this version "
                          f"does with backends that keep no per-batch plan: torch_native (the CPU path); "
                          f"{backend or 'the GPU default backend'} would need one child backend per micro-batch")
    if not cpu_engine and not _has_flag(argv, "--disable-cuda-graph"):
        raise LaunchError(f"--moe-dual-batch {moe.dual_batch} runs decode forwards through its own micro-batch "
                          "pipeline (host threads, a split chosen per batch shape), which CUDA graphs would freeze "
                          "at capture time; add --disable-cuda-graph")
    for flag, bad in (("--tp-size", "1"), ("--pp-size", "1"), ("--dp-size", "1")):
        value = _flag_value(argv, flag)
        if value is not None and value != bad:
            raise LaunchError(f"--moe-dual-batch {moe.dual_batch} runs on one rank; it cannot be combined with "
                              f"{flag} {value}")
    if _has_flag(argv, "--enable-two-batch-overlap"):
        raise LaunchError("--moe-dual-batch is the project's own two-micro-batch overlap (no all-to-all backend "
                          "needed); do not combine it with SGLang's --enable-two-batch-overlap")
    stats_dir = tempfile.mkdtemp(prefix="sgl_moe-dual-batch-")
    RuntimeConfig(dual_batch=moe.dual_batch, dual_batch_always=moe.dual_batch_always, profile_dir=stats_dir).export()
    logger.info("dual micro-batch attention-MoE overlap: %s (decode forwards of >= 2 sequences)", moe.dual_batch)
    return stats_dir


def export_runtime(argv: list[str], moe: MoeArgs, cpu_engine: bool) -> str | None:
    """Check the patch flags against the SGLang flags and hand the patches their configuration (through the
    environment SGLang's processes inherit). Returns the calibration directory (None without streaming)."""
    from sgl_moe.patches.runtime_env import RuntimeConfig

    if moe.dual_batch != "off" and not moe.streaming:
        return export_dual_batch(argv, moe, cpu_engine)
    if not moe.streaming:
        return None
    what = "--moe-expert-offload" if moe.expert_offload else f"--moe-weight-streaming {moe.weight_streaming}"
    if not cpu_engine and not _has_flag(argv, "--disable-cuda-graph"):
        raise LaunchError(f"{what} swaps expert buffers per layer (and reads the routed expert ids on the host), "
                          "which CUDA graphs would freeze at capture time; add --disable-cuda-graph")
    for flag in ("--ep-size", "--expert-parallel-size"):
        value = _flag_value(argv, flag)
        if value is not None and value != "1":
            raise LaunchError(f"{what} keeps every expert of a layer reachable from each rank; it cannot be "
                              f"combined with {flag} {value}")
    if _has_flag(argv, "--enable-two-batch-overlap"):
        raise LaunchError(f"{what} cannot be combined with --enable-two-batch-overlap")
    if moe.expert_offload and moe.execution != "on_demand":
        check_predictor_bundle(_flag_value(argv, "--model-path", "--model"))
    profile_dir = tempfile.mkdtemp(prefix="sgl_moe-calibration-")
    RuntimeConfig(weight_streaming=moe.stream_mode, stream_window=moe.stream_window,
                  expert_offload=moe.expert_offload, predictor=moe.predictor, execution=moe.execution,
                  resident_experts=moe.resident_experts, profile_dir=profile_dir).export()
    logger.info("expert weight streaming: %s, window %d; Θ calibration files in %s", moe.stream_mode,
                moe.stream_window, profile_dir)
    if moe.expert_offload:
        logger.info("expert offload for decode: predictor %s, execution %s, %d resident experts per layer",
                    moe.predictor, moe.execution, moe.resident_experts)
    return profile_dir


def prepare(argv: list[str], moe: MoeArgs, device: str, profile_dir: str | None = None):
    """Import SGLang, let it parse and check its arguments, and add the sgl_moe routes to its app."""
    from sglang.srt.server_args import prepare_server_args

    from sgl_moe.worker_routes import install_routes

    build_parser(with_sglang=True).parse_args(argv)  # unknown flags and bad values: one line, before SGLang
    try:
        server_args = prepare_server_args(argv)
        # SGLang validates flag combinations (e.g. --prefill-only-disable-kv-cache without --is-embedding) while
        # resolving; doing it here turns its refusal into one line instead of a traceback from run_server.
        server_args.resolve_once()
    except (ValueError, AssertionError, TypeError) as exc:
        raise LaunchError(f"SGLang rejected the arguments: {str(exc).strip().splitlines()[0]}") from None
    install_routes(server_args, moe, device, profile_dir)
    return server_args


def serve(server_args) -> None:
    """Run SGLang's HTTP server (blocks until shutdown), then make sure its child processes are gone."""
    from sglang.launch_server import run_server
    from sglang.srt.utils import kill_process_tree

    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s: %(message)s", datefmt="%H:%M:%S")
    if "-h" in argv or "--help" in argv:
        build_parser(with_sglang=True).print_help()
        return 0
    moe_parser = _OneLineArgumentParser(add_help=False, allow_abbrev=False)
    MoeArgs.add_cli_args(moe_parser)
    profile_dir: str | None = None
    try:
        moe_ns, sglang_argv = moe_parser.parse_known_args(argv)
        moe = MoeArgs.from_cli_args(moe_ns)
        moe.validate()
        check_values(sglang_argv)
        sglang_argv = with_defaults(sglang_argv)
        preflight(sglang_argv)
        plan, sglang_argv = apply_platform(sglang_argv)
        profile_dir = export_runtime(sglang_argv, moe, plan.cpu_engine)
        if _has_flag(sglang_argv, "--prefill-only-disable-kv-cache"):
            logger.warning("--prefill-only-disable-kv-cache: requests keep no KV cache (the seed's KV-cache-free "
                           "mode); no prefix reuse, so the router's prefix affinity has nothing to win. SGLang "
                           "0.5.23 allows it only with --is-embedding")
        logger.info("starting SGLang: %s", " ".join(sglang_argv))
        server_args = prepare(sglang_argv, moe, "cpu" if plan.cpu_engine else "cuda", profile_dir)
    except (LaunchError, MoeArgsError) as exc:
        print(f"sgl_moe.launch_server: error: {exc}", file=sys.stderr)
        if profile_dir:
            shutil.rmtree(profile_dir, ignore_errors=True)
        return 2
    t0 = time.time()
    try:
        serve(server_args)
    finally:
        if profile_dir:
            shutil.rmtree(profile_dir, ignore_errors=True)
    logger.info("server stopped after %.0f s", time.time() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
