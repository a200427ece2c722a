"""``benchmarks/interpreted_calls.py`` and its hook: a process running ``sgl_moe.router`` with the hook on its path
counts its calls into bytecode and writes them on ``SIGUSR1``; the reader turns two snapshots into calls per request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import interpreted_calls  # noqa: E402

PROGRAM = """
import os, signal, time
def f():
    return 1
for _ in range(7):
    f()
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.2)
"""


def test_the_hook_counts_bytecode_calls_and_writes_them_on_sigusr1(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "benchmarks" / "interpreted_calls"),
           "INTERPRETED_CALLS_OUT": str(tmp_path)}
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    subprocess.run([sys.executable, str(program), "sgl_moe.router"], env=env, check=True, timeout=60)
    [dump] = tmp_path.glob("calls-*-1.json")
    counts = json.loads(dump.read_text())["counts"]
    assert [n for k, n in counts.items() if k.endswith(":f")] == [7]


def test_the_hook_stays_out_of_other_processes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "benchmarks" / "interpreted_calls"),
           "INTERPRETED_CALLS_OUT": str(tmp_path)}
    # Not a router: SIGUSR1 keeps its default action (the process ends by it) and nothing is written.
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, timeout=60)
    assert done.returncode != 0 and not list(tmp_path.glob("calls-*.json"))


def test_calls_per_request_are_the_difference_over_the_requests_between():
    rows = interpreted_calls.per_request({"a": 10, "b": 5}, {"a": 30, "b": 5, "c": 4}, 4)
    assert rows == [("a", 5.0), ("c", 1.0)]
    with pytest.raises(ValueError):
        interpreted_calls.per_request({}, {"a": 1}, 0)
