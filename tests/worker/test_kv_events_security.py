"""Where a worker's KV events are bound and how they are secured (launcher), and what ``/sgl_moe/info`` reveals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from starlette.datastructures import Headers

from sgl_moe.kv_event_keys import generate
from sgl_moe.wire import KV_EVENTS_CURVE_PUBLISHER, KvEventEndpoint, TokenizerFiles, kv_event_endpoints
from sgl_moe.worker import preflight
from sgl_moe.worker.args import MoeArgs, MoeArgsError
from sgl_moe.worker.argv import ArgvView
from sgl_moe.worker.info import public_view
from sgl_moe.worker.preflight import LaunchError, kv_events_bind_host, with_defaults
from sgl_moe.worker.routes import is_admin


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    worker_dir, router_dir = generate(str(tmp_path_factory.mktemp("keys") / "k"))
    return worker_dir, router_dir


@pytest.fixture
def any_port_free(monkeypatch):
    """Addresses of other machines cannot be bound here; the decision under test comes before the bind."""
    monkeypatch.setattr(preflight, "port_free", lambda host, port: True)


def _kv(argv: ArgvView) -> dict:
    return json.loads(argv.value("--kv-events-config"))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2", "[::1]"])
def test_loopback_hosts_bind_loopback_without_keys(host):
    assert kv_events_bind_host(host, MoeArgs()) == "127.0.0.1"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.2", "10.1.2.3"])
def test_non_loopback_without_keys_is_refused_with_what_to_pass(host):
    with pytest.raises(LaunchError) as exc:
        kv_events_bind_host(host, MoeArgs())
    for needle in ("token ids", "python -m sgl_moe.kv_event_keys", "--moe-kv-events-keys",
                   "--moe-kv-events-allow-unauthenticated", "--kv-events-config"):
        assert needle in str(exc.value)


@pytest.mark.parametrize("host, bound", [("192.0.2.2", "192.0.2.2"), ("0.0.0.0", "*"), ("::", "*")])
def test_asked_for_or_keyed_binds_the_served_address_wildcard_only_for_a_wildcard_host(host, bound, keys):
    assert kv_events_bind_host(host, MoeArgs(kv_events_allow_unauthenticated=True)) == bound
    assert kv_events_bind_host(host, MoeArgs(kv_events_keys=str(keys[0]))) == bound


def test_ipv6_address_is_refused_clearly():
    with pytest.raises(LaunchError, match="IPv6"):
        kv_events_bind_host("fd00::2", MoeArgs(kv_events_allow_unauthenticated=True))


def test_default_config_is_loopback_plain_zmq():
    kv = _kv(with_defaults(ArgvView(["--port", "31234"])))
    assert kv == {"publisher": "zmq", "bind": True, "topic": "kv", "endpoint": "tcp://127.0.0.1:32234",
                  "replay_endpoint": "tcp://127.0.0.1:33234"}


def test_non_loopback_host_binds_that_host_never_star(any_port_free):
    argv = ArgvView(["--host", "192.0.2.2", "--port", "31234"])
    kv = _kv(with_defaults(argv, MoeArgs(kv_events_allow_unauthenticated=True)))
    assert kv["endpoint"] == "tcp://192.0.2.2:32234" and kv["replay_endpoint"] == "tcp://192.0.2.2:33234"
    assert kv["publisher"] == "zmq"
    with pytest.raises(LaunchError, match="--moe-kv-events-keys"):
        with_defaults(argv)  # no MoeArgs: their defaults, which refuse


def test_keys_select_the_curve_publisher(keys, any_port_free):
    moe = MoeArgs(kv_events_keys=str(keys[0]))
    kv = _kv(with_defaults(ArgvView(["--host", "0.0.0.0", "--port", "31234"]), moe))
    assert kv["publisher"] == KV_EVENTS_CURVE_PUBLISHER and kv["endpoint"] == "tcp://*:32234"
    kv = _kv(with_defaults(ArgvView(["--port", "31234"]), moe))
    assert kv["publisher"] == KV_EVENTS_CURVE_PUBLISHER and kv["endpoint"] == "tcp://127.0.0.1:32234"


def test_users_own_config_is_kept_and_secured_when_keys_are_given(keys):
    own = {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "t"}
    argv = ArgvView(["--kv-events-config", json.dumps(own)])
    assert _kv(with_defaults(argv)) == own  # asked for explicitly: taken as given
    secured = with_defaults(argv, MoeArgs(kv_events_keys=str(keys[0])))
    assert _kv(secured) == {**own, "publisher": KV_EVENTS_CURVE_PUBLISHER}
    null = ArgvView(["--kv-events-config", '{"publisher": "null"}'])
    assert _kv(with_defaults(null, MoeArgs(kv_events_keys=str(keys[0])))) == {"publisher": "null"}


@pytest.mark.parametrize("config, needle", [
    ("{not json", "not valid JSON"), ("[1]", "must be a JSON object"),
    ('{"publisher": "zmq", "endpoint": "ipc:///tmp/x"}', "must be tcp://HOST:PORT"),
])
def test_bad_kv_events_config_is_one_line(config, needle):
    with pytest.raises(LaunchError, match=needle):
        with_defaults(ArgvView(["--kv-events-config", config]))


def test_bad_key_folder_is_a_flag_error(tmp_path):
    with pytest.raises(MoeArgsError, match="--moe-kv-events-keys: .* is not a directory"):
        MoeArgs(kv_events_keys=str(tmp_path / "missing")).validate()


def test_launcher_refuses_all_interfaces_without_keys_in_one_line():
    out = subprocess.run([sys.executable, "-m", "sgl_moe.launch_server", "--host", "0.0.0.0"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    [line] = [x for x in out.stderr.splitlines() if x.startswith("sgl_moe.launch_server: error:")]
    assert "--moe-kv-events-keys" in line


def test_one_endpoint_rule_port_plus_rank():
    cfg = json.dumps({"publisher": KV_EVENTS_CURVE_PUBLISHER, "endpoint": "tcp://10.0.0.1:7000",
                      "replay_endpoint": "tcp://10.0.0.1:8000", "topic": "kv"})
    assert kv_event_endpoints(cfg, 2, "PUBKEY") == [
        KvEventEndpoint(0, "tcp://10.0.0.1:7000", "tcp://10.0.0.1:8000", "kv", "PUBKEY"),
        KvEventEndpoint(1, "tcp://10.0.0.1:7001", "tcp://10.0.0.1:8001", "kv", "PUBKEY")]
    assert kv_event_endpoints('{"publisher": "zmq"}', 1)[0].endpoint == "tcp://*:5557"  # SGLang's default
    assert kv_event_endpoints('{"publisher": "null"}', 1) == []


def _info(tmp_path):
    from sgl_moe.flops import FlopsModel
    from sgl_moe.wire import SaturationInfo, WorkerInfo

    model = tmp_path / "models" / "tiny-moe"
    model.mkdir(parents=True)
    return WorkerInfo(model_name="tiny", page_size=16, flops=FlopsModel(1, 1, 1, 1, 1),
                      saturation=SaturationInfo(1.0, "manual", "manual"), model_path=str(model),
                      tokenizer=TokenizerFiles(path=str(model), files=["tokenizer.json"]),
                      moe_args={"kv_events_keys": str(tmp_path / "keys" / "worker"), "stream_window": 2})


def test_public_info_has_no_absolute_paths(tmp_path):
    full = _info(tmp_path)
    public = public_view(full)
    assert public.model_path == "tiny-moe" and public.tokenizer.path == "tiny-moe"
    assert public.moe_args == {"kv_events_keys": "worker", "stream_window": 2}
    assert str(tmp_path) not in json.dumps(__import__("sgl_moe.wire", fromlist=["to_builtins"]).to_builtins(public))
    assert public.tokenizer.files == full.tokenizer.files  # what the router reads the tokenizer through
    hub = public_view(type(full)(**{**full.__dict__, "model_path": "Qwen/Qwen3-30B-A3B"}))
    assert hub.model_path == "Qwen/Qwen3-30B-A3B"  # a hub id is not a path of this machine


@pytest.mark.parametrize("headers, admin", [
    ({}, False), ({"Authorization": "Bearer s3cret"}, True), ({"authorization": "bearer s3cret"}, True),
    ({"X-Admin-Key": "s3cret"}, True), ({"Authorization": "Bearer wrong"}, False),
    ({"Authorization": "Bearer client-key", "X-Admin-Key": "s3cret"}, True), ({"Authorization": "s3cret"}, False),
])
def test_admin_key_reveals_paths(headers, admin):
    assert is_admin(Headers(headers), "s3cret") is admin
    assert is_admin(Headers(headers), None) is False  # a worker without an admin key reveals them to no one
