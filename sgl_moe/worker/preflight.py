"""Checks of the launcher's input that need no SGLang import, and the project's defaults for SGLang's flags.

Everything here fails with ``LaunchError`` (one line, exit status 2) before SGLang starts.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
from pathlib import Path

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.wire import (
    KV_EVENTS_CURVE_PUBLISHER,
    KV_EVENTS_PORT_OFFSET,
    KV_EVENTS_PUBLISHERS,
    NCCL_PORT_OFFSET,
    PREDICTOR_DIR,
    REPLAY_PORT_OFFSET,
    kv_event_endpoints,
    kv_events_config,
)
from sgl_moe.worker.args import MoeArgs
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


def nccl_port(port: int) -> int:
    """The port torch.distributed's rendezvous binds (SGLang's ``--nccl-port``) when the user gives none: the
    worker's port - 1000, free on every IPv4 interface (the TCPStore binds the wildcard)."""
    nccl = port + NCCL_PORT_OFFSET
    if nccl < 1024:
        raise LaunchError(f"--port {port} leaves no room for the distributed rendezvous port (port - "
                          f"{-NCCL_PORT_OFFSET}); use a higher port or pass --nccl-port")
    if not port_free("0.0.0.0", nccl):
        raise LaunchError(f"port {nccl} (worker port - {-NCCL_PORT_OFFSET}, for the distributed rendezvous) is in "
                          "use; pick another --port or pass --nccl-port")
    return nccl


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


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "*", "")
"""``--host`` values that serve on every interface."""


def is_loopback(host: str) -> bool:
    """An address (or a name resolving to one) that only this machine reaches."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except OSError:
        return False  # unresolvable: SGLang itself will fail to serve on it


def kv_events_bind_host(host: str, moe: MoeArgs) -> str:
    """The address the KV-event sockets bind: the one the worker serves on, never every interface unless asked.

    Loopback: 127.0.0.1 (also for ::1: SGLang 0.5.23's publisher binds IPv4 only, it never sets ZMQ_IPV6).
    Anything else publishes the prompts' token ids off this machine, so it needs CURVE keys or the explicit
    ``--moe-kv-events-allow-unauthenticated``; then a wildcard ``--host`` binds ``*`` and a concrete one that
    address (a name is resolved to its IPv4 address).
    """
    if host not in WILDCARD_HOSTS and is_loopback(host):
        return "127.0.0.1"
    if moe.kv_events_keys is None and not moe.kv_events_allow_unauthenticated:
        raise LaunchError(
            f"--host {host or '(all interfaces)'} would publish the KV events, which carry the prompts' token ids, "
            "to anyone who reaches their ports: make CURVE keys with `python -m sgl_moe.kv_event_keys DIR` and pass "
            "--moe-kv-events-keys DIR/worker (the router: --kv-events-keys DIR/router), or accept unauthenticated "
            "events with --moe-kv-events-allow-unauthenticated, or give your own --kv-events-config")
    if host in WILDCARD_HOSTS:
        return "*"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            return socket.gethostbyname(host)
        except OSError as exc:
            raise LaunchError(f"--host {host} does not resolve to an IPv4 address: {exc}") from None
    if address.version != 4:
        raise LaunchError(f"--host {host}: SGLang 0.5.23's KV-event publisher cannot bind IPv6 addresses (it never "
                          "sets ZMQ_IPV6); serve on an IPv4 address, or give --kv-events-config with an IPv4 endpoint")
    return str(address)


def kv_events_defaults(argv: ArgvView, moe: MoeArgs) -> ArgvView:
    """``--kv-events-config``: the project's default (bound to the worker's own address, port + 1000 / + 2000),
    or the user's own taken as given; with ``--moe-kv-events-keys`` either publishes through the CURVE publisher."""
    text = argv.value("--kv-events-config")
    if text is not None:
        try:
            cfg = kv_events_config(text)
            kv_event_endpoints(text, 1)  # the router subscribes to tcp:// endpoints only
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        if cfg.get("publisher") not in KV_EVENTS_PUBLISHERS:
            if moe.kv_events_keys is not None:
                logger.warning("--moe-kv-events-keys: --kv-events-config publishes no ZMQ events; keys unused")
            return argv
        if moe.kv_events_keys is not None and cfg.get("publisher") != KV_EVENTS_CURVE_PUBLISHER:
            return argv.plus("--kv-events-config", json.dumps({**cfg, "publisher": KV_EVENTS_CURVE_PUBLISHER}))
        endpoint = str(cfg.get("endpoint") or "")
        host = endpoint[len("tcp://"):].rpartition(":")[0] if endpoint.startswith("tcp://") else ""
        if moe.kv_events_keys is None and host and (host in WILDCARD_HOSTS or not is_loopback(host)):
            logger.warning("--kv-events-config %s: KV events (the prompts' token ids) are published without "
                           "authentication; see --moe-kv-events-keys", endpoint)
        return argv
    host = argv.value("--host") or "127.0.0.1"
    bind_host = kv_events_bind_host(host, moe)
    port = argv.int_value("--port", default=DEFAULT_PORT)
    dp = argv.int_value("--dp-size", "--data-parallel-size", default=1)
    events, replay = event_ports(bind_host, port, dp)
    if bind_host != "127.0.0.1" and moe.kv_events_keys is None:
        logger.warning("KV events (the prompts' token ids) are published WITHOUT authentication on %s ports "
                       "%d and %d (--moe-kv-events-allow-unauthenticated)", bind_host, events, replay)
    return argv.plus("--kv-events-config", json.dumps({
        "publisher": "zmq" if moe.kv_events_keys is None else KV_EVENTS_CURVE_PUBLISHER, "bind": True, "topic": "kv",
        "endpoint": f"tcp://{bind_host}:{events}", "replay_endpoint": f"tcp://{bind_host}:{replay}",
    }))


def with_defaults(argv: ArgvView, moe: MoeArgs | None = None) -> ArgvView:
    """SGLang argv with the project's defaults added where the user gave none (``moe``: the worker's --moe-*
    flags, which decide how the KV events are bound and secured; None: their defaults)."""
    if not argv.has("--model-path", "--model"):
        argv = argv.plus("--model-path", str(DEFAULT_MODEL_DIR))
    if not argv.has("--page-size"):
        argv = argv.plus("--page-size", str(DEFAULT_PAGE_SIZE))
    if not argv.has("--nccl-port"):
        argv = argv.plus("--nccl-port", str(nccl_port(argv.int_value("--port", default=DEFAULT_PORT))))
    return kv_events_defaults(argv, moe if moe is not None else MoeArgs())


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
            cfg = kv_events_config(kv)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        endpoint = str(cfg.get("endpoint", ""))
        publishes = cfg.get("publisher") in KV_EVENTS_PUBLISHERS
        if publishes and endpoint.startswith("tcp://") and cfg.get("bind") is not False:
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
