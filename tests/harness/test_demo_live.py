"""The README's main command, run as a newcomer runs it: ``bash tools/demo.sh`` in a fresh process, from the
repository root (issue 29: it failed from a fresh clone while CI stayed green, because no test ran it).

The demo starts its own router and two workers on the shipped model, so this test runs before the session's
shared workers start (``tests/harness`` sorts before ``tests/live``) and leaves nothing running behind it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from sgl_moe.harness.worker_process import DERIVED_PORT_OFFSETS, WORKER_PORTS
from sgl_moe.worker.preflight import port_free

pytestmark = pytest.mark.worker

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2


def _free_demo_port() -> int:
    """A router port whose next ``WORKERS`` ports (the demo's workers) and their KV-event ports are free."""
    for port in range(WORKER_PORTS.start + 1500, WORKER_PORTS.stop - WORKERS - 1, 7):
        ports = [port, *(port + 1 + i + off for i in range(WORKERS) for off in (0, *DERIVED_PORT_OFFSETS))]
        if all(port_free("127.0.0.1", p) for p in ports):
            return port
    pytest.fail("no free port block for the demo")


def test_the_readme_main_command_prints_its_results_and_exits_0(tmp_path):
    port = _free_demo_port()
    proc = subprocess.run(["bash", "tools/demo.sh", "--port", str(port), "--logs", str(tmp_path / "logs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in out + proc.stderr
    # Both workers came up and the router joined them.
    assert len(re.findall(r"worker http://127\.0\.0\.1:\d+ ready in \d+ s", out)) == WORKERS, out
    assert f"router ready at http://127.0.0.1:{port}" in out
    # One /v1/score call classified the four prompts, each with its probabilities summing to 1.
    assert "single-token classification of 4 prompts sharing a prefix" in out
    rows = re.findall(r"-> (\w+)\s+\(((?:\w+=[0-9.]+\s*)+)\)", out)
    assert len(rows) == 4, out
    for best, shown in rows:
        probs = {k: float(v) for k, v in (kv.split("=") for kv in shown.split())}
        assert abs(sum(probs.values()) - 1.0) < 0.01 and probs[best] == max(probs.values())
    # The router's prefill-only API: a single choice and a multi-selection of four siblings.
    assert re.search(r"/v1/classify: one call, 5 prefills", out), out
    assert re.search(r"single choice : answer [ABC] \((json|socket|math)\)", out), out
    # The prefix cache: the second identical prompt is served from the cache (two full pages), and the router
    # predicted exactly what the worker reported.
    reqs = re.findall(r"request (\d): (\d+) prompt tokens, (\d+) served from the prefix cache -> worker (w\d), "
                      r"router predicted (\d+) cached", out)
    assert len(reqs) == 3, out
    assert int(reqs[1][2]) == 32 and int(reqs[1][2]) > int(reqs[0][2])
    for _, _, cached, _, predicted in reqs:
        assert cached == predicted
    # The per-worker summary names each worker's calibrated (or honestly kept) Θ.
    assert len(re.findall(r"w\d http://127\.0\.0\.1:\d+: \d+ requests, \d+ committed blocks, Θ = ", out)) == WORKERS
