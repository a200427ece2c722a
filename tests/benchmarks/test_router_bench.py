"""``benchmarks/router_bench.py`` runs as docs/router.md shows it (``.venv/bin/python benchmarks/router_bench.py``),
at its smallest size: both parts (in-process decision time; ``python -m sgl_moe.router`` over HTTP in front of
an instant stand-in worker) with two workers, 20 requests and half a second of load. The figures are checked
for presence and sanity, never for speed."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALLEST = ["--workers", "2", "--prompt-tokens", "64", "--requests", "20", "--rate-seconds", "0.5",
            "--concurrency", "2", "--stand-ins", "1", "--prompt-words", "10"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/router_bench.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_smallest_run_reports_decision_time_and_request_rate(tmp_path):
    """Covers ``.venv/bin/python benchmarks/router_bench.py`` (docs/router.md). Only sgl_moe's router is driven:
    sglang-router takes ~9 s to start against a stand-in on this 2-core host (ours ~3 s), and the live test of
    ``bench_serving_routers.py`` starts it through the same ``RouterUnderTest``."""
    out = tmp_path / "router_bench.json"
    proc = _run(*SMALLEST, "--routers", "longest_block_match", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) == {"decision", "rate", "machine"}

    d = result["decision"]
    assert (d["workers"], d["prompt_tokens"], d["requests"]) == (2, 64, 20)
    for key in ("hash_p50_us", "hash_p99_us", "decision_p50_us", "decision_p99_us", "hash_plus_decision_p99_us"):
        assert d[key] > 0, key
    assert d["hash_p50_us"] <= d["hash_p99_us"] and d["decision_p50_us"] <= d["decision_p99_us"]

    rate = result["rate"]
    assert (rate["stand_ins"], rate["concurrency"], rate["prompt_words"]) == (1, 2, 10)
    for name in ("direct_to_stand_in", "sgl_moe longest_block_match"):
        r = rate[name]
        assert r["requests"] > 0 and r["errors"] == 0, (name, r)
        assert r["req_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"], (name, r)
    assert rate["sgl_moe longest_block_match"]["router_cpu_ms_per_request"] > 0
    assert result["machine"]["cpus"] >= 1

    # What a user reads: the same figures printed, then the JSON.
    assert "decision       p50" in proc.stdout and "sgl_moe longest_block_match" in proc.stdout
    assert json.loads(proc.stdout[proc.stdout.index("\n{") + 1:]) == result


def test_bad_sizes_are_one_line_errors():
    proc = _run(*SMALLEST, "--requests", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run(*SMALLEST, "--routers", "fastest")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and "Traceback" not in proc.stderr
