"""``benchmarks/tokenizer_bench.py`` runs as docs/router.md shows it (``.venv/bin/python
benchmarks/tokenizer_bench.py``), at its smallest size: one fresh build interpreter and one router start-up
against a stand-in worker, 10 prompts. The figures are checked for presence and sanity, never for speed."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/tokenizer_bench.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=180)


def test_smallest_run_reports_build_startup_and_throughput(tmp_path):
    """Covers ``.venv/bin/python benchmarks/tokenizer_bench.py`` (docs/router.md) with ``--prompts 10 --repeats 1``."""
    out = tmp_path / "tokenizer_bench.json"
    proc = _run("--prompts", "10", "--repeats", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) == {"medians", "builds", "startups"}
    assert len(result["builds"]) == len(result["startups"]) == 1

    [build] = result["builds"]
    assert build["prompts"] == 10 and build["words"] >= 10 * 50 and build["tokens"] > 0
    assert build["exact"] is True  # the shipped model's tokenizer loads exactly
    assert not {"torch", "sglang"} & set(build["heavy_modules"])  # the router's tokenizer path stays light
    med = result["medians"]
    for key in ("build_cold_s", "build_warm_s", "batch_tokens_per_s", "single_tokens_per_s", "rss_mib",
                "startup_to_ready_s", "router_rss_mib", "router_peak_rss_mib"):
        assert med[key] > 0, key
    assert med["rss_mib"] <= med["peak_rss_mib"] and med["router_rss_mib"] <= med["router_peak_rss_mib"]

    assert "medians of 1 fresh interpreters" in proc.stdout
    assert f"10 prompts, {build['words']} words, {build['tokens']} tokens" in proc.stdout
    assert "encode_batch" in proc.stdout and "router start-up to ready" in proc.stdout


def test_bad_sizes_are_one_line_errors():
    proc = _run("--repeats", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr and "Traceback" not in proc.stderr
