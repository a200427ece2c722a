"""A started worker's port leaves its derived ports free (CI once failed a fixture: port + 1000 in use; another
run: the replay port taken by the distributed rendezvous), and no two workers of one process share one."""

from __future__ import annotations

import socket

import pytest

from sgl_moe.harness import worker_process
from sgl_moe.wire import KV_EVENTS_PORT_OFFSET, NCCL_PORT_OFFSET, REPLAY_PORT_OFFSET


def _listening(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


@pytest.fixture(autouse=True)
def _nothing_handed_out(monkeypatch):
    monkeypatch.setattr(worker_process, "_handed_out", set())


def _fresh_pick() -> int:
    """A pick by a process that has handed out nothing yet."""
    worker_process._handed_out.clear()
    return worker_process.free_worker_port()


def test_a_port_whose_event_port_is_taken_is_never_chosen(monkeypatch):
    blocked, free = 24000, 24500
    monkeypatch.setattr(worker_process, "WORKER_PORTS", range(blocked, free + 1, free - blocked))
    try:
        held = _listening(blocked + KV_EVENTS_PORT_OFFSET)
    except OSError:
        pytest.skip("the port this test holds is in use on this machine")
    with held:
        chosen = {_fresh_pick() for _ in range(20)}
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


def test_a_port_whose_rendezvous_port_is_taken_on_any_interface_is_never_chosen(monkeypatch):
    blocked, free = 24200, 24700
    monkeypatch.setattr(worker_process, "WORKER_PORTS", range(blocked, free + 1, free - blocked))
    try:
        held = socket.socket()
        held.bind(("0.0.0.0", blocked + NCCL_PORT_OFFSET))
        held.listen()
    except OSError:
        pytest.skip("the port this test holds is in use on this machine")
    with held:
        assert {_fresh_pick() for _ in range(20)} == {free}


def test_a_port_handed_out_is_never_a_later_workers_port_or_derived_port(monkeypatch):
    """A worker still starting has bound nothing yet: the next pick must not take its port, its KV-event ports or
    its rendezvous port, though all are free."""
    first = 24300
    monkeypatch.setattr(worker_process, "WORKER_PORTS", range(first, first + 1))
    assert worker_process.free_worker_port() == first
    with pytest.raises(worker_process.WorkerStartError):
        worker_process.free_worker_port(attempts=5)
    for taken in (first + KV_EVENTS_PORT_OFFSET, first + REPLAY_PORT_OFFSET, first + NCCL_PORT_OFFSET):
        monkeypatch.setattr(worker_process, "WORKER_PORTS", range(taken, taken + 1))
        with pytest.raises(worker_process.WorkerStartError):
            worker_process.free_worker_port(attempts=5)
    monkeypatch.setattr(worker_process, "WORKER_PORTS", range(first + 5, first + 6))
    assert worker_process.free_worker_port() == first + 5
