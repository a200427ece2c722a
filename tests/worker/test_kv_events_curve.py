"""The CURVE KV-event publisher patch: registered under its own name, fail-closed, pinned to SGLang 0.5.23.

(That a listener reads it with the router's keys and reads nothing without them: tests/router/
test_event_listener_curve.py.)
"""

from __future__ import annotations

import atexit
import json

import pytest
import zmq

from sgl_moe.kv_event_keys import generate
from sgl_moe.patches import kv_events_curve, plugin, runtime_env
from sgl_moe.patches.runtime_env import RuntimeConfig
from sgl_moe.wire import KV_EVENTS_CURVE_PUBLISHER, RUNTIME_ENV_VAR
from sgl_moe.worker.args import MoeArgs


@pytest.fixture(scope="module")
def worker_keys(tmp_path_factory):
    worker_dir, _ = generate(str(tmp_path_factory.mktemp("keys") / "k"))
    return str(worker_dir)


def _config(**extra) -> str:
    return json.dumps({"publisher": KV_EVENTS_CURVE_PUBLISHER, "endpoint": "tcp://127.0.0.1:*",
                       "replay_endpoint": "tcp://127.0.0.1:*", "topic": "kv", "bind": True, **extra})


def test_plugin_registers_the_curve_publisher_only_with_keys(worker_keys, monkeypatch):
    from sglang.srt.disaggregation.kv_events import EventPublisherFactory, ZmqEventPublisher

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setenv(RUNTIME_ENV_VAR, RuntimeConfig(MoeArgs(kv_events_keys=worker_keys)).to_env())
    runtime_env.current.cache_clear()
    try:
        plugin.register()
    finally:
        monkeypatch.delenv(RUNTIME_ENV_VAR)
        runtime_env.current.cache_clear()
    pub = EventPublisherFactory.create(_config())
    atexit.unregister(pub.shutdown)
    try:
        assert isinstance(pub, ZmqEventPublisher) and type(pub).__name__ == "CurveZmqEventPublisher"
        assert pub._pub.getsockopt(zmq.CURVE_SERVER) == 1 and pub._replay.getsockopt(zmq.CURVE_SERVER) == 1
        assert pub._pub.getsockopt(zmq.MECHANISM) == zmq.CURVE
    finally:
        pub.shutdown()
    plain = EventPublisherFactory.create(_config(publisher="zmq"))  # SGLang's own publisher is untouched
    atexit.unregister(plain.shutdown)
    try:
        assert type(plain) is ZmqEventPublisher and plain._pub.getsockopt(zmq.CURVE_SERVER) == 0
    finally:
        plain.shutdown()


def test_registering_twice_is_harmless(worker_keys):
    kv_events_curve.register(worker_keys)
    kv_events_curve.register(worker_keys)


def test_refuses_to_publish_in_clear_if_sockets_are_not_curve(worker_keys, monkeypatch):
    monkeypatch.setattr(kv_events_curve, "curve_context", lambda keys: zmq.Context.instance())
    cls = kv_events_curve.publisher_class(worker_keys)
    with pytest.raises(kv_events_curve.CurvePatchError, match="not a CURVE server"):
        cls(attn_dp_rank=0, endpoint="tcp://127.0.0.1:*", replay_endpoint=None, topic="kv", bind=True)


def test_another_sglang_is_refused_loudly(monkeypatch, worker_keys):
    monkeypatch.setattr(kv_events_curve, "KV_EVENTS_MODULE", "json")  # a module without SGLang's publisher
    with pytest.raises(kv_events_curve.CurvePatchError, match="ZmqEventPublisher._socket_setup is missing"):
        kv_events_curve.register(worker_keys)


def test_without_the_patch_a_curve_config_fails_instead_of_publishing_in_clear():
    from sglang.srt.disaggregation.kv_events import EventPublisherFactory

    registry = dict(EventPublisherFactory._registry)
    registry.pop(KV_EVENTS_CURVE_PUBLISHER, None)
    original = EventPublisherFactory._registry
    EventPublisherFactory._registry = registry
    try:
        with pytest.raises(ValueError, match="Unknown event publisher"):
            EventPublisherFactory.create(_config())
    finally:
        EventPublisherFactory._registry = original
