"""The benchmark scripts that need real SGLang workers run as docs/policy-matrix.md and docs/offload.md show them,
at their smallest size, against the session's workers (``cluster``, ``worker``). The figures they print or write
are checked for presence and sanity, never for speed."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_bench_serving_routers_smallest_run(cluster, tmp_path):
    """Covers ``.venv/bin/python benchmarks/bench_serving_routers.py --worker-urls ... --repeats 3``
    (docs/policy-matrix.md) at one repeat of 4 generated-shared-prefix requests, through sgl_moe's router and
    sglang-router's ``cache_aware`` (the comparison the doc reports; ``round_robin`` is left out: a third router
    start and bench_serving process for no path the other two do not take). About a minute on the 2-core CI host
    (67 s seen), most of it the two ``sglang.bench_serving`` interpreters importing sglang (~18 s each)."""
    out = tmp_path / "bench_serving.json"
    proc = _run("bench_serving_routers.py", "--worker-urls", *(w.url for w in cluster), "--repeats", "1",
                "--routers", "longest_block_match", "cache_aware", "--groups", "2", "--prompts-per-group", "2",
                "--system-len", "32", "--question-len", "8", "--concurrency", "4", "--log-dir", str(tmp_path / "logs"),
                "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["args"]["repeats"] == "1"
    assert set(result["results"]) == {"sgl_moe longest_block_match", "sglang-router cache_aware"}
    for name, runs in result["results"].items():
        [row] = runs
        assert row["completed"] == 4, (name, row)  # every request of 2 groups x 2 prompts
        for key in ("request_throughput", "input_throughput", "mean_e2e_latency_ms", "p99_e2e_latency_ms",
                    "duration"):
            assert row[key] is not None and row[key] > 0, (name, key, row)
        # Measured, not necessarily positive: the kernel counts CPU time in 10 ms ticks, and sglang-router handled
        # these 4 requests inside one tick on a CI run (0.0 s read).
        assert row["router_cpu_s"] is not None and row["router_cpu_s"] >= 0, (name, row)
    assert len(re.findall(r"^run 1: .* req/s .* 4 completed", proc.stdout, re.M)) == 2, proc.stdout


@pytest.mark.parametrize("worker_group", ["offload"], indirect=True)
def test_offload_worker_bench_smallest_run(worker, worker_group):
    """Covers ``.venv/bin/python benchmarks/offload_worker_bench.py --plain URL --worker exact=URL --worker
    speculative=URL`` (docs/offload.md) with one offload worker (exact), 2 prompts of 200 characters, 4 greedy
    tokens each, against the session's plain ``worker``. The exact worker is the ``offload`` group's (conftest.py),
    which test_offload_live.py uses too: pytest runs that module's tests right after this one, so no worker starts
    for this test alone. The speculative worker is left out: the same code path in the script.

    TPOT is not checked even for sign: at 4 tokens it is (t_4 - t_1) / 3 of one timed prompt, and t_1 includes the
    prompt's uncached prefill while t_4 reuses it (an offload worker's prefill streams experts: -33 ms seen)."""
    proc = _run("offload_worker_bench.py", "--plain", worker.url, "--worker", f"exact={worker_group['exact'].url}",
                "--prompts", "2", "--chars", "200", "--new-tokens", "4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "prompt 2/2 done" in proc.stderr
    rows = {cells[0]: cells[1:] for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    assert set(rows) == {"worker", "plain", "exact"}, proc.stdout
    plain, exact = rows["plain"], rows["exact"]
    assert math.isfinite(float(plain[0])) and plain[1] == "1.000" and plain[2] == "8/8" and plain[3] == "4.0"
    assert math.isfinite(float(exact[0])) and math.isfinite(float(exact[1]))
    assert exact[2] == "8/8" and exact[3] == "4.0"  # exact execution: plain's greedy tokens, no difference
    hits, misses = (int(x) for x in exact[4].split(" / "))
    # The worker writes its counts at most once a second, during a forward: the script reads them after a pause and
    # a one-token request that makes it write them (without it, 0 experts copied was seen in CI). A 4-token run's
    # decode may still hit and miss nothing after layer 0 (0 / 0 seen in a full suite run).
    assert hits >= 0 and misses >= 0 and int(exact[5]) > 0 and float(exact[6]) > 0, proc.stdout


def test_worker_front_cpu_smallest_run(worker, tmp_path):
    """Covers ``.venv/bin/python benchmarks/worker_front_cpu.py`` (docs/router.md) at its smallest size against the
    session's reference ``worker``: one 200-token shared stream, 20 requests per form, one repeat. Every request is
    answered, and the worker prefilled as many tokens as the ids sent (text and ids alike: a form that prefilled
    another count fails the run); the CPU figures are checked for presence, never for size (10 ms ticks over 20
    requests)."""
    out = tmp_path / "worker_front_cpu.json"
    proc = _run("worker_front_cpu.py", "--prompt-tokens", "200", "--shapes", "shared", "--requests", "20",
                "--warmup", "4", "--repeats", "1", "--worker-url", worker.url, "--worker-pid", str(worker.proc.pid),
                "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "--worker-pid" in result["command"] and result["config"]["requests"] == 20
    rows = {(r["stream"], r["form"]): r for r in result["rows"]}
    assert set(rows) == {("shared-200", "text"), ("shared-200", "ids")}
    for key, r in rows.items():
        assert r["requests"] == 20 and r["errors"] == 0 and r["prompt_tokens_differ"] == 0, (key, r)
        assert 150 <= r["tokens_mean"] <= 200, (key, r)
        assert r["front_cpu_ms_per_request"] >= 0 and r["engine_cpu_ms_per_request"] > 0, (key, r)
    assert set(result["front_cpu_saved_ms_per_request"]) == {"shared-200"}
    assert "front CPU the ids spare the worker per request: shared-200" in proc.stdout


def test_worker_front_cpu_refuses_a_pid_without_a_url():
    proc = _run("worker_front_cpu.py", "--worker-pid", "1")
    assert proc.returncode == 2 and "--worker-url and --worker-pid go together" in proc.stderr, proc.stderr
