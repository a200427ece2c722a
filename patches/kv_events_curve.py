"""Patch: SGLang's KV-event publisher as a CURVE server (``--moe-kv-events-keys``): encrypted, known clients only.

SGLang 0.5.23's ``ZmqEventPublisher`` creates its PUB and replay ROUTER sockets in ``_socket_setup`` from
``self._ctx`` (the process-wide ``zmq.Context.instance()``) and sets no security option. This module adds a
publisher under its own name, ``wire.KV_EVENTS_CURVE_PUBLISHER``, through SGLang's published extension point
``EventPublisherFactory.register_publisher``: a subclass whose ``_socket_setup`` hands SGLang's own code a
dedicated context whose new sockets are CURVE servers with the worker's key pair, and whose ZAP handler
(``zmq.auth.ThreadAuthenticator``) admits only the client public keys of the key directory. Everything else
(binding, sequence numbers, replay buffer, publisher thread) is SGLang's, untouched.

Fail-closed by construction: the launcher writes this publisher's name into ``--kv-events-config`` only when
keys are given, so a scheduler where this patch is not registered refuses to start (SGLang: unknown event
publisher), and a publisher whose sockets did not come out as CURVE servers (SGLang changed how it creates
them) raises instead of publishing in the clear. ``check_sglang`` pins the two symbols it relies on.
"""

from __future__ import annotations

import logging
import threading

import zmq

from sgl_moe.kv_event_keys import ServerKeys, load_server_keys
from sgl_moe.wire import KV_EVENTS_CURVE_PUBLISHER

log = logging.getLogger("sgl_moe.patches.kv_events_curve")

KV_EVENTS_MODULE = "sglang.srt.disaggregation.kv_events"


class CurvePatchError(RuntimeError):
    """SGLang's publisher does not look as this patch expects (a version other than 0.5.23), or its sockets
    did not come out as CURVE servers."""


_lock = threading.Lock()
_contexts: dict[str, tuple[zmq.Context, object]] = {}
"""Key directory -> (context, its running ZAP authenticator): one per process, kept for the process's life."""


def curve_context(keys: ServerKeys) -> zmq.Context:
    """A context (one per key directory and process) whose new sockets are CURVE servers with ``keys``, and whose
    ZAP handler admits only ``keys.clients``."""
    with _lock:
        if keys.directory in _contexts:
            return _contexts[keys.directory][0]
        from zmq.auth.thread import ThreadAuthenticator

        ctx = zmq.Context()
        auth = ThreadAuthenticator(ctx, log=logging.getLogger("sgl_moe.patches.kv_events_curve.zap"))
        auth.start()
        auth.configure_curve_callback(domain="*", credentials_provider=_Allowed(keys.clients))
        ctx.setsockopt(zmq.CURVE_SERVER, 1)
        ctx.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        ctx.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
        _contexts[keys.directory] = (ctx, auth)
        return ctx


class _Allowed:
    """ZAP credentials provider: a client is admitted iff its public key is one of the key directory's."""

    def __init__(self, clients: frozenset[bytes]) -> None:
        self.clients = clients

    def callback(self, domain: str, key: bytes) -> bool:
        """``key``: the client's public key, Z85-encoded (pyzmq's ``Authenticator`` encodes it)."""
        allowed = key in self.clients
        if not allowed:
            log.warning("KV events: refused a client whose CURVE public key is not in the key directory")
        return allowed


def check_sglang():
    """SGLang's ``ZmqEventPublisher`` and ``EventPublisherFactory`` as 0.5.23 has them; CurvePatchError if not."""
    import importlib

    module = importlib.import_module(KV_EVENTS_MODULE)
    publisher = getattr(module, "ZmqEventPublisher", None)
    factory = getattr(module, "EventPublisherFactory", None)
    if publisher is None or not callable(getattr(publisher, "_socket_setup", None)):
        raise CurvePatchError(f"{KV_EVENTS_MODULE}.ZmqEventPublisher._socket_setup is missing: this SGLang is not "
                              "0.5.23, --moe-kv-events-keys cannot secure its KV events")
    if factory is None or not callable(getattr(factory, "register_publisher", None)):
        raise CurvePatchError(f"{KV_EVENTS_MODULE}.EventPublisherFactory.register_publisher is missing: this SGLang "
                              "is not 0.5.23, --moe-kv-events-keys cannot secure its KV events")
    return publisher, factory


def publisher_class(keys_dir: str):
    """SGLang's ``ZmqEventPublisher`` with CURVE-server sockets from the keys in ``keys_dir``."""
    base, _ = check_sglang()

    class CurveZmqEventPublisher(base):  # type: ignore[misc, valid-type]
        def _socket_setup(self) -> None:
            self._ctx = curve_context(load_server_keys(keys_dir))
            super()._socket_setup()
            for role, sock in (("PUB", self._pub), ("replay ROUTER", self._replay)):
                if sock is not None and sock.getsockopt(zmq.CURVE_SERVER) != 1:
                    raise CurvePatchError(f"the KV-event {role} socket is not a CURVE server: SGLang no longer "
                                          "creates it from the publisher's context; refusing to publish in clear")
            log.info("KV events: CURVE publisher on %s (replay %s), clients from %s", self._endpoint,
                     self._replay_endpoint, keys_dir)

    return CurveZmqEventPublisher


def register(keys_dir: str) -> None:
    """Make ``--kv-events-config '{"publisher": "sgl_moe_curve", ...}'`` mean the CURVE publisher (idempotent)."""
    _, factory = check_sglang()
    try:
        factory.register_publisher(KV_EVENTS_CURVE_PUBLISHER, publisher_class(keys_dir))
    except KeyError:
        return  # registered already in this process
    log.info("sgl_moe patch registered: CURVE-authenticated KV events (keys %s)", keys_dir)
