"""``benchmarks/replicas_soak.py`` runs as its docstring shows it, at its smallest size: locust through two router
replicas with one placement owner and a real ``nats-server``, a worker and a replica SIGKILLed and restarted twice
(the owner first). What must hold whatever the speed: no request lost after one retry, every failed first try
within a kill's window, and memory reported for every process."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_smallest_soak_loses_nothing(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "benchmarks/replicas_soak.py", "--duration-s", "40", "--period-s", "15",
                           "--restart-after-s", "3", "--users", "4", "--log-dir", str(tmp_path / "logs"),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    result = json.loads(out.read_text())
    assert result["requests"] > 40 and result["lost"] == 0, result["table"]
    assert [(k["worker"], k["replica"]) for k in result["kills"]] == [("worker0", "r0"), ("worker1", "r1")]
    assert result["first_try_failures"] == result["explained_by_kills"], result["table"]
    assert all(k["first_try_failures"] <= 4 for k in result["kills"]), result["table"]  # at most one per user
    names = {m["process"] for m in result["memory"]}
    assert {"worker0", "worker1", "worker2", "r0", "r1", "nats-server", "locust"} <= names, result["memory"]
    assert "| kill at (s) | worker | replica |" in proc.stdout
