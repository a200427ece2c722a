"""A started worker's port leaves its KV-event ports free (CI once failed a fixture: port + 1000 in use)."""

from __future__ import annotations

import socket

import pytest

from sgl_moe.harness import worker_process
from sgl_moe.wire import KV_EVENTS_PORT_OFFSET, REPLAY_PORT_OFFSET


def _listening(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_port_whose_event_port_is_taken_is_never_chosen(monkeypatch):
    blocked, free = 24000, 24500
    monkeypatch.setattr(worker_process, "WORKER_PORTS", range(blocked, free + 1, free - blocked))
    try:
        held = _listening(blocked + KV_EVENTS_PORT_OFFSET)
    except OSError:
        pytest.skip("the port this test holds is in use on this machine")
    with held:
        chosen = {worker_process.free_worker_port() for _ in range(20)}
    assert chosen == {free}
    for port in (free, free + KV_EVENTS_PORT_OFFSET, free + REPLAY_PORT_OFFSET):
        _listening(port).close()  # all bindable, and below the ephemeral range
    assert free + REPLAY_PORT_OFFSET + 3 < 32768


def test_no_free_port_is_a_clear_error(monkeypatch):
    port = 24100
    monkeypatch.setattr(worker_process, "WORKER_PORTS", range(port, port + 1))
    try:
        held = _listening(port + REPLAY_PORT_OFFSET)
    except OSError:
        pytest.skip("the port this test holds is in use on this machine")
    with held, pytest.raises(worker_process.WorkerStartError, match="no free worker port"):
        worker_process.free_worker_port(attempts=5)
