"""CURVE keys for the KV-event sockets: ``python -m sgl_moe.kv_event_keys DIR`` makes them, worker and router load them.

A worker's KV events carry its prompts' token ids, so with keys its publisher (PUB and replay ROUTER) is a
CURVE server that talks only to clients whose public key it holds, and only encrypted. One command makes a
deployment's keys, in two folders that go to different machines::

    DIR/worker/worker.key_secret   the workers' key pair     } --moe-kv-events-keys DIR/worker  (every worker)
    DIR/worker/router.key          the router's public key   }   every *.key there is a client allowed to read
    DIR/router/router.key_secret   the router's key pair     } --kv-events-keys DIR/router      (the router)
    DIR/router/worker.key          the workers' public key   }   the router talks only to that server key

Files are ZeroMQ's own certificate format (``zmq.auth``). Secret files must be readable by their owner alone.
Imports zmq only (no torch, no sglang): the router loads its keys with it.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

WORKER = "worker"
ROUTER = "router"
SECRET_SUFFIX = ".key_secret"
PUBLIC_SUFFIX = ".key"


class KeyFileError(ValueError):
    """A key directory or file that cannot be used (missing, unreadable, malformed, readable by others)."""


@dataclass(frozen=True)
class ServerKeys:
    """The worker side: its key pair and the public keys of the clients allowed to connect (Z85 bytes)."""

    public: bytes
    secret: bytes
    clients: frozenset[bytes]
    directory: str


@dataclass(frozen=True)
class ClientKeys:
    """The router side: its key pair and the one server (worker) key it accepts (Z85 bytes)."""

    public: bytes
    secret: bytes
    server: bytes


def _key_pair(path: Path) -> tuple[bytes, bytes]:
    import zmq.auth

    if not path.is_file():
        raise KeyFileError(f"{path} does not exist (make keys with `python -m sgl_moe.kv_event_keys DIR`)")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise KeyFileError(f"{path} holds a secret key but is readable by others (mode {mode:o}); chmod 600 it")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path} is not a ZeroMQ secret certificate: {exc}") from None
    if not public or not secret:
        raise KeyFileError(f"{path} is not a ZeroMQ secret certificate (no secret-key entry)")
    return public, secret


def _public_key(path: Path) -> bytes:
    import zmq.auth

    if not path.is_file():
        raise KeyFileError(f"{path} does not exist (make keys with `python -m sgl_moe.kv_event_keys DIR`)")
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path} is not a ZeroMQ public certificate: {exc}") from None
    return public


def _directory(path: str) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise KeyFileError(f"{path} is not a directory (make keys with `python -m sgl_moe.kv_event_keys DIR`)")
    return folder


def load_server_keys(path: str) -> ServerKeys:
    """``DIR/worker``: ``worker.key_secret`` and every ``*.key`` (the clients allowed); KeyFileError otherwise."""
    folder = _directory(path)
    public, secret = _key_pair(folder / f"{WORKER}{SECRET_SUFFIX}")
    clients = frozenset(_public_key(p) for p in sorted(folder.glob(f"*{PUBLIC_SUFFIX}")))
    if not clients:
        raise KeyFileError(f"{path} holds no client public key (*{PUBLIC_SUFFIX}): no router could read the events")
    return ServerKeys(public=public, secret=secret, clients=clients, directory=str(folder.resolve()))


def load_client_keys(path: str) -> ClientKeys:
    """``DIR/router``: ``router.key_secret`` and ``worker.key`` (the server accepted); KeyFileError otherwise."""
    folder = _directory(path)
    public, secret = _key_pair(folder / f"{ROUTER}{SECRET_SUFFIX}")
    return ClientKeys(public=public, secret=secret, server=_public_key(folder / f"{WORKER}{PUBLIC_SUFFIX}"))


def generate(path: str) -> tuple[Path, Path]:
    """Make a deployment's keys under ``path`` (``worker/`` and ``router/``); refuses to overwrite any."""
    import zmq.auth

    root = Path(path).expanduser()
    worker_dir, router_dir = root / WORKER, root / ROUTER
    for folder in (worker_dir, router_dir):
        if folder.exists() and any(folder.iterdir()):
            raise KeyFileError(f"{folder} exists and is not empty: not overwriting keys")
    root.mkdir(parents=True, exist_ok=True)
    for folder in (worker_dir, router_dir):
        folder.mkdir(mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        for name in (WORKER, ROUTER):
            zmq.auth.create_certificates(tmp, name)
            os.chmod(Path(tmp) / f"{name}{SECRET_SUFFIX}", 0o600)
        moves = {f"{WORKER}{SECRET_SUFFIX}": worker_dir, f"{ROUTER}{PUBLIC_SUFFIX}": worker_dir,
                 f"{ROUTER}{SECRET_SUFFIX}": router_dir, f"{WORKER}{PUBLIC_SUFFIX}": router_dir}
        for name, folder in moves.items():
            os.replace(Path(tmp) / name, folder / name)
    return worker_dir, router_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sgl_moe.kv_event_keys",
        description="Make CURVE keys for the KV-event sockets: DIR/worker for every worker "
                    "(--moe-kv-events-keys), DIR/router for the router (--kv-events-keys).")
    parser.add_argument("dir", metavar="DIR", help="where to write worker/ and router/ (created if absent)")
    args = parser.parse_args(argv)
    try:
        worker_dir, router_dir = generate(args.dir)
    except (KeyFileError, OSError) as exc:
        print(f"sgl_moe.kv_event_keys: error: {exc}", file=sys.stderr)
        return 2
    print(f"worker keys: {worker_dir}  (python -m sgl_moe.launch_server ... --moe-kv-events-keys {worker_dir})")
    print(f"router keys: {router_dir}  (python -m sgl_moe.router ... --kv-events-keys {router_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
