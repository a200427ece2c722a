"""``benchmarks/parse_path.py`` runs as its docstring shows it, at its smallest size, with this checkout as its own
``--baseline`` (the path a comparison with an older commit takes). Figures are checked for presence and sanity,
never for speed."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/parse_path.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_smallest_run_reports_each_stage_for_both_checkouts(tmp_path, marked_python):
    out = tmp_path / "parse_path.json"
    python, marker = marked_python
    proc = _run("--prompt-tokens", "50", "--requests", "40", "--warmup", "10", "--repeats", "1",
                "--baseline", str(REPO), "--baseline-python", str(python), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["streams"] == ["shared-50", "unique-50"] and result["requests"] == 40
    assert set(result["runs"]) == {"this checkout", f"baseline {REPO.name}"} and marker.exists()
    for label, reps in result["runs"].items():
        assert len(reps) == 1
        for stream in result["streams"]:
            fig = reps[0][stream]
            assert all(fig[s] > 0 for s in ("parse", "hash", "attempt")), (label, stream, fig)
            assert abs(fig["total"] - fig["parse"] - fig["hash"] - fig["attempt"]) < 1e-6
    assert proc.stdout.startswith("| stream | stage | this checkout us/req")
    assert "| unique-50 | total |" in proc.stdout


def test_bad_arguments_are_one_line_errors():
    for bad, message in ((["--requests", "0"], "--requests must be positive"),
                         (["--warmup", "-1"], "--warmup must be 0 or more"),
                         (["--prompt-tokens", "9"], "--prompt-tokens must be between"),
                         (["--baseline", "/nonexistent"], "not a checkout of sgl_moe"),
                         (["--baseline-python", sys.executable], "--baseline-python needs --baseline DIR")):
        proc = _run(*bad, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, (bad, proc.stderr)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="--instructions needs valgrind (apt-get install valgrind)")
def test_instructions_are_counted_per_stream_under_callgrind(tmp_path):
    """Each stream's measured requests are counted apart (one callgrind dump per stream): two streams of one
    checkout give two counts, each of a size a parse takes (a 50-token prompt: well over 10,000 instructions, far
    under the interpreter's start-up, which is not counted)."""
    out = tmp_path / "counted.json"
    proc = _run("--prompt-tokens", "50", "--requests", "10", "--warmup", "5", "--instructions", "--out", str(out),
                timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["instructions"] is True
    [counted] = result["runs"]["this checkout"]
    assert set(counted) == {"shared-50", "unique-50"}
    for stream, fig in counted.items():
        assert 10_000 < fig["instructions"] < 50_000_000, (stream, fig)
    assert "| shared-50 | " in proc.stdout and "instructions/req" in proc.stdout
