"""Checks of the launcher's input that need no SGLang import, and the project's defaults for SGLang's flags.

Everything here fails with ``LaunchError`` (one line, exit status 2) before SGLang starts.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.wire import KV_EVENTS_PORT_OFFSET, PREDICTOR_DIR, REPLAY_PORT_OFFSET
from sgl_moe.worker.argv import ArgvView

logger = logging.getLogger("sgl_moe.launch_server")

DEFAULT_PAGE_SIZE = 16
DEFAULT_PORT = 30000

POSITIVE_INT_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--tp-size", "--tensor-parallel-size"), ("--dp-size", "--data-parallel-size"),
    ("--pp-size", "--pipeline-parallel-size"), ("--ep-size", "--expert-parallel-size"),
    ("--max-running-requests",), ("--max-total-tokens",), ("--max-prefill-tokens",), ("--context-length",),
    ("--page-size",),
)
"""Sizes SGLang 0.5.23 accepts unchecked and then crashes (tp 0) or hangs (max-running-requests -3) on."""


class LaunchError(Exception):
    """Bad input detected before SGLang starts; printed as one line."""


def port_free(host: str, port: int) -> bool:
    bind_host = "0.0.0.0" if host in ("*", "0.0.0.0", "") else host
    with socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError:
            return False
    return True


def event_ports(host: str, port: int, dp: int) -> tuple[int, int]:
    """KV-event and replay ports derived from the worker's own port alone (port + 1000, port + 2000, plus the
    DP rank), so workers on neighbouring ports started at the same moment never pick the same ones."""
    events, replay = port + KV_EVENTS_PORT_OFFSET, port + REPLAY_PORT_OFFSET
    if replay + dp > 65535:
        raise LaunchError(f"--port {port} leaves no room for the KV-event ports (port + {KV_EVENTS_PORT_OFFSET} "
                          f"and + {REPLAY_PORT_OFFSET}); use a lower port or pass --kv-events-config")
    busy = [p for base in (events, replay) for p in range(base, base + dp) if not port_free(host, p)]
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


def check_values(argv: ArgvView) -> None:
    """Syntax of the values the launcher itself reads (before it derives defaults from them)."""
    port_text = argv.value("--port") or str(DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise LaunchError(f"--port must be a TCP port number, got {port_text!r}")
    for names in POSITIVE_INT_FLAGS:
        value = argv.value(*names)
        if value is not None and not (value.isdigit() and int(value) >= 1):
            raise LaunchError(f"{names[0]} must be a positive integer, got {value!r}")


def with_defaults(argv: ArgvView) -> ArgvView:
    """SGLang argv with the project's defaults added where the user gave none."""
    if not argv.has("--model-path", "--model"):
        argv = argv.plus("--model-path", str(DEFAULT_MODEL_DIR))
    if not argv.has("--page-size"):
        argv = argv.plus("--page-size", str(DEFAULT_PAGE_SIZE))
    if not argv.has("--kv-events-config"):
        host = argv.value("--host") or "127.0.0.1"
        port = argv.int_value("--port", default=DEFAULT_PORT)
        dp = argv.int_value("--dp-size", "--data-parallel-size", default=1)
        pub_host = "127.0.0.1" if host in ("127.0.0.1", "localhost") else "*"
        events, replay = event_ports(host, port, dp)
        argv = argv.plus("--kv-events-config", json.dumps({
            "publisher": "zmq", "bind": True, "topic": "kv",
            "endpoint": f"tcp://{pub_host}:{events}", "replay_endpoint": f"tcp://{pub_host}:{replay}",
        }))
    return argv


def preflight(argv: ArgvView) -> None:
    """Checks against this machine: model path, ports, KV-events config."""
    check_model_path(argv.value("--model-path", "--model") or "")
    host = argv.value("--host") or "127.0.0.1"
    port = argv.value("--port") or str(DEFAULT_PORT)
    if not port_free(host, int(port)):
        raise LaunchError(f"port {port} on {host} is already in use; pick another with --port")
    kv = argv.value("--kv-events-config")
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
            if ep_port.isdigit() and not port_free(ep_host, int(ep_port)):
                raise LaunchError(f"KV-events endpoint {endpoint} is already in use")
    if argv.has("--disable-radix-cache"):
        logger.warning("--disable-radix-cache: prefix caching is off, so no KV events and no prefix reuse")
    if argv.has("--prefill-only-disable-kv-cache"):
        logger.warning("--prefill-only-disable-kv-cache: requests keep no KV cache (the seed's KV-cache-free "
                       "mode); no prefix reuse, so the router's prefix affinity has nothing to win. SGLang "
                       "0.5.23 allows it only with --is-embedding")


def check_predictor_bundle(model_path: str | None) -> None:
    """Expert prediction needs the model's trained bundle (default vectors, estimator): refuse early, in one line."""
    if model_path is None or not Path(model_path).is_dir():
        return  # a hub id: the worker looks for the bundle in its snapshot and says so if absent
    if not (Path(model_path) / PREDICTOR_DIR).is_dir():
        raise LaunchError(f"--moe-expert-offload predicts the next layer's experts from {model_path}/{PREDICTOR_DIR}, "
                          f"which does not exist; train it with `python -m sgl_moe.prediction.train --model "
                          f"{model_path}`, or use --moe-execution on_demand (no prediction)")
