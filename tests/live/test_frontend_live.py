"""Smoke runs of the user-facing tools against the real router and real workers: the classify CLI, the locust
load test, and the policy benchmark (all five routers, a handful of requests: seconds, not minutes)."""

import csv
import json
import subprocess
import sys

from sgl_moe.workloads import WorkloadConfig, generate, to_task


def run(args, timeout=600):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


def test_classify_cli_answers_every_line(cluster, router_factory, tmp_path):
    router = router_factory(cluster)
    tasks = [to_task(r) for r in generate(WorkloadConfig(requests=12, length_scale=16, seed=3))]
    src = tmp_path / "tasks.jsonl"
    src.write_text("".join(json.dumps(t) + "\n" for t in tasks) + "{not json\n")
    out = tmp_path / "results.jsonl"
    proc = run(["-m", "sgl_moe.classify", str(src), "--router", router.url, "--out", str(out), "--batch-size", "5"])
    assert proc.returncode == 1, proc.stderr  # the bad line fails, and says so
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    good = {x["line"]: x for x in lines if "result" in x}
    assert sorted(good) == list(range(len(tasks)))
    for n, t in enumerate(tasks):
        r = good[n]["result"]
        assert (r["id"], r["type"]) == (t["id"], t["type"])
        if t["type"] != "multi":  # multi gives P(yes) per candidate, which need not sum to 1
            assert abs(sum(r["probs"]) - 1) < 1e-6
    assert any(x.get("line") == len(tasks) and "error" in x for x in lines)
    again = run(["-m", "sgl_moe.classify", str(src), "--router", router.url, "--out", str(out), "--no-retry-failed"])
    assert again.returncode == 1 and len(out.read_text().splitlines()) == len(lines)  # resumed: nothing re-sent


def test_locust_load_test_counts_requests_and_no_failures(cluster, router_factory, tmp_path):
    router = router_factory(cluster)
    prefix = tmp_path / "mix"
    proc = run(["-m", "sgl_moe.loadtest", "--host", router.url, "--users", "2", "--run-time", "6s",
                "--csv", str(prefix), "--workload", "mix", "--workload-scale", "16", "--max-failure-ratio", "0"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(open(f"{prefix}_stats.csv")))
    total = next(r for r in rows if r["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0


def test_policy_benchmark_smoke(cluster, tmp_path):
    out = tmp_path / "bench.json"
    proc = run(["-m", "sgl_moe.policy_bench", "--worker-urls", *[w.url for w in cluster], "--requests", "8",
                "--length-scale", "16", "--concurrency", "4", "--out", str(out), "--log-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {r["policy"]: r for r in data["results"]}
    assert set(rows) == {"longest_block_match", "round_robin", "least_flops", "cache_aware", "power_of_two"}
    for r in rows.values():
        assert r["failures"] == 0 and r["requests"] == data["stream"]["requests"]
        assert r["prompt_tokens"] == data["stream"]["prompt_tokens"]  # every router sent the same tokens
        # No placement beats one unbounded cache holding everything (caches are flushed between policies).
        assert r["cached_fraction"] <= data["stream"]["oracle_fraction"] + 1e-9
    assert "sgl_moe longest_block_match" in proc.stdout
