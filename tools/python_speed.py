"""Seconds of CPU this interpreter takes for a fixed piece of pure-Python work (the best of five runs).

``tools/bootstrap.sh`` runs it with each Python 3.11 it finds and builds ``.venv`` on the fastest: the router is
Python, and the same code runs ~25-30% faster on a build made with profile-guided and link-time optimisation
(Debian's, python.org's, conda's) than on a plain source build (pyenv's default, a shared ``libpython``). The work is
the router's kind: calls, attribute reads, small objects, dicts, string formatting, comprehensions.

    python3.11 tools/python_speed.py   # prints e.g. 0.081
"""

from __future__ import annotations

import time


class _Item:
    __slots__ = ("key", "value")

    def __init__(self, key: int, value: int) -> None:
        self.key = key
        self.value = value


def _add(a: int, b: int, c: int = 1) -> int:
    return a + b + c


def _work(n: int) -> int:
    table: dict[int, _Item] = {}
    total = 0
    for i in range(n):
        item = _Item(i, i + 1)
        total += _add(item.key, item.value)
        table[i & 255] = item
        text = f"{i}-{total}"
        total += len(text) + sum([j for j in range(8)])
        if isinstance(text, str) and text.startswith("1"):
            total += 1
    return total


def speed(n: int = 100_000, runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        _work(n)
        best = min(best, time.process_time() - t0)
    return best


if __name__ == "__main__":
    print(f"{speed():.3f}")
