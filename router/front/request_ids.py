"""Ids the router gives requests that came without one: 32 hex digits, unique without a system call each.

A random 64-bit prefix per process (drawn again in a forked child) and a 64-bit counter, both written at full
width. Every id has the same length, so none is a prefix of another: SGLang's abort matches ``rid`` by prefix.
``os.urandom(16)`` per id cost a ``getrandom`` system call, twice per forwarded request.
"""

from __future__ import annotations

import itertools
import os

_prefix = os.urandom(8).hex()
_counter = itertools.count()


def _redraw() -> None:
    global _prefix, _counter
    _prefix, _counter = os.urandom(8).hex(), itertools.count()


os.register_at_fork(after_in_child=_redraw)


def new_rid() -> str:
    """A new id: unique among this process's, and across processes with probability 1 - n^2 / 2^65."""
    return f"{_prefix}{next(_counter):016x}"
