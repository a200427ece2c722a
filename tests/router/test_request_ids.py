"""Request ids the router makes: one length (SGLang aborts by rid prefix), unique, new in a forked child."""

from __future__ import annotations

import os

from sgl_moe.router.front.request_ids import new_rid


def test_ids_are_unique_and_none_is_a_prefix_of_another():
    ids = [new_rid() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert {len(i) for i in ids} == {32}
    assert all(int(i, 16) >= 0 for i in ids[:100])


def test_a_forked_child_draws_its_own_prefix():
    parent = new_rid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then exit at once
        os.write(write, new_rid().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert len(child) == 32 and child[:16] != parent[:16]
