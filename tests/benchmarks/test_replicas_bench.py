"""``benchmarks/replicas_bench.py`` runs as its docstring shows it, at its smallest size: one router, two alone,
two sharing tables and two with one placement owner through a real ``nats-server``, in front of stand-in workers.
The figures are checked for presence and sanity, never for speed or for which configuration wins."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_smallest_run_reports_every_configuration(tmp_path):
    out = tmp_path / "replicas.json"
    proc = subprocess.run([sys.executable, "benchmarks/replicas_bench.py", "--replicas", "2", "--requests", "24",
                           "--clients", "4", "--groups", "4", "--log-dir", str(tmp_path / "logs"), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["config"] for r in result["rows"]] == ["1 router", "2 alone", "2 shared", "2 owner"]
    for r in result["rows"]:
        assert r["requests"] == 24 and r["errors"] == 0 and r["req_per_s"] > 0, r
        assert 0 < r["cached_fraction"] < 1 and r["samples"] > 0 and r["max_load_over_theta"] > 0, r
    assert [r["placement"] for r in result["rows"]] == [None, None, "shared", "owner"]
    assert proc.stdout.startswith("| routers | req/s | cached fraction |")
    assert "| 2 owner |" in proc.stdout
