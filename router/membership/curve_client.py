"""The KV-event listener's CURVE client side: keying its sockets, and saying what to fix when handshakes fail.

With ``--kv-events-keys`` the router's SUB and replay (DEALER) sockets are CURVE clients of a publisher started
with ``--moe-kv-events-keys``; a router and a worker that disagree on keys just exchange nothing, so failed
handshakes are watched on the SUB socket's monitor, counted, and explained once per kind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from sgl_moe.kv_event_keys import ClientKeys

if TYPE_CHECKING:
    from sgl_moe.router.membership.event_listener import ListenerStats

logger = logging.getLogger("sgl_moe.router.events")

HANDSHAKE_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                      | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
"""The socket-monitor events of a failed handshake."""


def secure(sock: zmq.Socket, curve: ClientKeys | None) -> None:
    """Make ``sock`` a CURVE client with the router's keys (before it connects), if the router has keys."""
    if curve is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, curve.server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret)


async def watch_handshakes(monitor: zmq.asyncio.Socket, curve: ClientKeys | None, stats: ListenerStats, who: str,
                           endpoint: str) -> None:
    """Count failed handshakes with the publisher and say once, per kind, what to fix: without this a
    router and a worker that disagree on keys just exchange nothing."""
    from zmq.utils.monitor import parse_monitor_message

    warned: set[int] = set()
    while True:
        event = parse_monitor_message(await monitor.recv_multipart())["event"]
        stats.handshake_failures += 1
        if event in warned:
            continue
        warned.add(event)
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and curve is None:
            hint = ("the publisher requires CURVE keys (worker started with --moe-kv-events-keys): start the "
                    "router with --kv-events-keys DIR/router")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            hint = ("the publisher does not use CURVE (worker started without --moe-kv-events-keys), but the "
                    "router has --kv-events-keys")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            hint = ("the worker refused the router's public key: put the router's router.key in the worker's "
                    "--moe-kv-events-keys folder")
        elif curve is None:  # ZeroMQ may report the refusal of a plain client without detail (seen under load)
            hint = ("handshake failed; if the worker was started with --moe-kv-events-keys, start the router with "
                    "--kv-events-keys DIR/router")
        else:  # no detail with keys: a wrong server key, or (seen under load) a publisher without CURVE
            hint = ("the worker's CURVE public key is not the worker.key in --kv-events-keys (keys of another "
                    "deployment?), or the publisher does not use CURVE (worker started without "
                    "--moe-kv-events-keys)")
        logger.warning("%s: cannot read KV events from %s: %s", who, endpoint, hint)
