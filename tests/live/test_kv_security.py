"""Private KV events on real workers: with CURVE keys only the router's keys read the events (and it routes with
cache hits on them); without keys a non-loopback worker binds its event sockets to its own address, never ``*``."""

from __future__ import annotations

import json
import socket
import time
import uuid

import msgspec
import pytest
import zmq

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.harness.router_client import generate, wait_until
from sgl_moe.harness.router_client import workers as router_workers
from sgl_moe.harness.worker_process import WorkerProcess
from sgl_moe.kv_event_keys import generate as generate_keys
from sgl_moe.kv_event_keys import load_client_keys

from .conftest import NO_THETA_PROFILE, WORKER_ARGS, start_side_by_side, stop_side_by_side

ADMIN_KEY = "kv-security-admin"


def unique_text(words: int = 80) -> str:
    tag = uuid.uuid4().hex
    return f"# {tag}\n" + " ".join(f"secret_{tag[i % 32]}{i}" for i in range(words)) + "\n"


def _sub(endpoint: str, keys=None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys.server, keys.public, keys.secret
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    return sock


def _stored_token_ids(sock: zmq.Socket, seconds: float) -> list[int]:
    """Token ids of every BlockStored event the socket receives within ``seconds``."""
    tokens: list[int] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000)):
            break
        _topic, _seq, payload = sock.recv_multipart()
        for event in msgspec.msgpack.decode(payload)[1]:
            if isinstance(event, dict) and event.get("type") == "BlockStored":
                tokens += event["token_ids"]
    return tokens


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv-keys")
    worker_dir, router_dir = generate_keys(str(root / "deployment"))
    return worker_dir, router_dir


@pytest.fixture(scope="module")
def kv_workers(keys, tmp_path_factory):
    """This module's workers, started side by side: ``curve`` (CURVE keys and an admin key) and, where this machine
    has a non-loopback IPv4 address, ``open`` (bound to that address, events without keys). No test here is
    about Θ, so neither runs the start-up profile."""
    folder = tmp_path_factory.mktemp("kv-security")
    workers = {"curve": WorkerProcess(log_path=folder / "curve.log",
                                      args=[*WORKER_ARGS, "--moe-kv-events-keys", str(keys[0]),
                                            "--admin-api-key", ADMIN_KEY, NO_THETA_PROFILE])}
    host = _non_loopback_ipv4()
    if host is not None:
        workers["open"] = WorkerProcess(log_path=folder / "open.log", host=host,
                                        args=[*WORKER_ARGS, "--moe-kv-events-allow-unauthenticated", NO_THETA_PROFILE])
    start_side_by_side(workers)
    yield workers
    stop_side_by_side(workers.values())


@pytest.fixture(scope="module")
def curve_worker(kv_workers):
    return kv_workers["curve"]


def test_events_are_unreadable_without_the_key(curve_worker, keys):
    [rank0] = curve_worker.info["kv_events"]
    router_keys = load_client_keys(str(keys[1]))
    assert rank0["curve_public_key"] == router_keys.server.decode()
    plain, keyed = _sub(rank0["endpoint"]), _sub(rank0["endpoint"], router_keys)
    try:
        time.sleep(1.0)  # both subscriptions in place (PUB drops what is sent before)
        text = unique_text()
        assert generate(curve_worker.url, text).status_code == 200
        prompt_ids = curve_worker_tokenize(curve_worker, text)
        got = _stored_token_ids(keyed, 5.0)
        assert len(got) >= 16 and got[:16] == prompt_ids[:16]  # the key reads the prompt's token ids
        assert _stored_token_ids(plain, 3.0) == []  # without it: nothing, not even the handshake
    finally:
        plain.close()
        keyed.close()
    dealer = zmq.Context.instance().socket(zmq.DEALER)  # the replay endpoint answers a keyless client nothing
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(rank0["replay_endpoint"])
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert not dealer.poll(3000)
    finally:
        dealer.close()


def curve_worker_tokenize(worker, text: str) -> list[int]:
    import httpx

    resp = httpx.post(f"{worker.url}/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1},
                                                      "return_logprob": True, "logprob_start_len": 0}, timeout=60)
    return [tok[1] for tok in resp.json()["meta_info"]["input_token_logprobs"]]


def test_router_with_the_key_routes_with_cache_hits(curve_worker, keys, router_factory):
    router = router_factory([curve_worker], "--kv-events-keys", str(keys[1]))
    text = unique_text(100)
    first = generate(router.url, text)
    assert first.status_code == 200, first.text
    worker = first.headers["x-sgl-moe-worker"]
    prompt_tokens = first.json()["meta_info"]["prompt_tokens"]
    wait_until(lambda: router_workers(router.url)[worker]["committed_blocks"] >= prompt_tokens // 16,
               what="blocks committed from CURVE events")
    second = generate(router.url, text + "more")
    reported = second.json()["meta_info"]["cached_tokens"]
    assert reported >= 64
    assert int(second.headers["x-sgl-moe-predicted-cached-tokens"]) == reported


def test_router_without_the_key_commits_nothing(curve_worker, router_factory):
    router = router_factory([curve_worker])
    first = generate(router.url, unique_text(100))
    assert first.status_code == 200, first.text
    time.sleep(3.0)
    assert router_workers(router.url)[first.headers["x-sgl-moe-worker"]]["committed_blocks"] == 0


def test_info_shows_absolute_paths_only_to_the_admin(curve_worker, keys):
    import httpx

    url = f"{curve_worker.url}/sgl_moe/info"
    public = httpx.get(url, timeout=30).json()
    assert public["model_path"] == DEFAULT_MODEL_DIR.name and public["tokenizer"]["path"] == DEFAULT_MODEL_DIR.name
    assert public["moe_args"]["kv_events_keys"] == "worker"
    # model_name is the served model name, SGLang's default for which is the model path (SGLang itself serves it
    # at /v1/models; --served-model-name hides it): every other field is free of this machine's paths.
    rest = json.dumps({**public, "model_name": None})
    assert str(DEFAULT_MODEL_DIR) not in rest and str(keys[0]) not in rest and "/work/" not in rest
    for headers in ({"Authorization": f"Bearer {ADMIN_KEY}"}, {"X-Admin-Key": ADMIN_KEY}):
        full = httpx.get(url, headers=headers, timeout=30).json()
        assert full["model_path"] == str(DEFAULT_MODEL_DIR) and full["moe_args"]["kv_events_keys"] == str(keys[0])
    wrong = httpx.get(url, headers={"Authorization": "Bearer nope"}, timeout=30).json()
    assert wrong["model_path"] == DEFAULT_MODEL_DIR.name
    # The router reads the tokenizer through the files route, not the path: it still gets every file.
    assert public["tokenizer"]["files"] and httpx.get(
        f"{curve_worker.url}/sgl_moe/tokenizer/tokenizer.json", timeout=30).content == (
        DEFAULT_MODEL_DIR / "tokenizer.json").read_bytes()


def _non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_non_loopback_host_binds_events_to_that_address_not_all_interfaces(kv_workers):
    if "open" not in kv_workers:
        pytest.skip("this machine has no non-loopback IPv4 address")
    w = kv_workers["open"]
    host = w.host
    [rank0] = w.info["kv_events"]
    events_port = int(rank0["endpoint"].rsplit(":", 1)[1])
    assert rank0["endpoint"] == f"tcp://{host}:{events_port}"
    assert rank0["replay_endpoint"] == f"tcp://{host}:{events_port + 1000}"
    assert rank0["curve_public_key"] is None
    for port in (events_port, events_port + 1000):
        with socket.socket() as s:  # bound to the address, so loopback finds nothing listening
            assert s.connect_ex(("127.0.0.1", port)) != 0
        with socket.create_connection((host, port), timeout=5):
            pass
