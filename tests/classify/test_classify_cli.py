"""The bulk classify client against an in-process stand-in for the router's /v1/classify (contract A).

The stand-in (doubles.fake_router) parses tasks with the router's own code and answers with hashed
probabilities, so these tests isolate the client: batching, the journal and resume, 400 splitting,
429 back-off, bad input lines, progress and exit codes.
"""

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from doubles.fake_router import FakeRouter

from sgl_moe.classify.cli import main
from sgl_moe.classify.journal import Journal, read_journal
from sgl_moe.classify.progress import Progress


def task(i: int, **extra) -> dict:
    return {"id": f"t{i}", "prompt": f"review number {i}: fine", "labels": [" positive", " negative"], **extra}


def write_tasks(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def entries(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def successes(path: Path) -> Counter:
    """Success entries per line; a torn line left by a kill is skipped, as the client's own reader does."""
    found = Counter()
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "result" in e and "error" not in e:
            found[e["line"]] += 1
    return found


@pytest.fixture
def fake():
    with FakeRouter() as f:
        yield f


def test_all_lines_answered_in_order_of_lines_with_ids(tmp_path, fake, capsys):
    src = write_tasks(tmp_path / "tasks.jsonl",
                      [task(i) for i in range(10)]
                      + [{"id": "c", "type": "choice", "prompt": "2+2?", "choices": ["3", "4"]},
                         {"id": 7, "type": "multi", "prompt": "tags?", "choices": ["a", "b", "c"]}])
    assert main([str(src), "--router", fake.url, "--batch-size", "5"]) == 0
    out = tmp_path / "tasks.results.jsonl"  # the default: the input with suffix .results.jsonl
    got = {e["line"]: e for e in entries(out)}
    assert sorted(got) == list(range(12))
    assert got[3]["id"] == "t3" and got[3]["result"]["id"] == "t3" and got[3]["result"]["type"] == "classify"
    assert got[10]["result"]["answer"] in ("A", "B")
    assert len(got[11]["result"]["probs"]) == 3 and got[11]["id"] == 7
    assert [len(b["inputs"]) for b in fake.classify_bodies()] == [5, 5, 2]
    assert "done 12, failed 0, skipped 0" in capsys.readouterr().err


def test_resume_after_kill_answers_every_line_exactly_once(tmp_path, fake):
    n = 200
    src = write_tasks(tmp_path / "tasks.jsonl", [task(i) for i in range(n)])
    out = tmp_path / "out.jsonl"
    fake.knobs.delay_s = 0.05
    cmd = [sys.executable, "-m", "sgl_moe.classify", str(src), "--router", fake.url, "--out", str(out),
           "--batch-size", "4", "--concurrency", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 40):
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    first = successes(out)
    assert 40 <= len(first) < n, "the kill must land mid-run"
    with out.open("a") as f:
        f.write('{"line": 199, "id": "t19')  # a torn last write: ignored, and must not spoil the next entry
    sent_before = len(fake.classify_bodies())

    fake.knobs.delay_s = 0.0
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    final = successes(out)
    assert set(final) == set(range(n)) and set(final.values()) == {1}
    resent = {t["id"] for b in fake.classify_bodies()[sent_before:] for t in b["inputs"]}
    assert not resent & {f"t{i}" for i in first}, "lines answered before the kill were sent again"
    assert read_journal(out)[199].ok


def test_ctrl_c_stops_cleanly_and_a_rerun_finishes(tmp_path, fake):
    src = write_tasks(tmp_path / "tasks.jsonl", [task(i) for i in range(300)])
    out = tmp_path / "out.jsonl"
    fake.knobs.delay_s = 0.05
    cmd = [sys.executable, "-m", "sgl_moe.classify", str(src), "--router", fake.url, "--out", str(out),
           "--batch-size", "2", "--concurrency", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 10):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "interrupted" in err and "Traceback" not in err
    assert out.read_bytes().endswith(b"\n")
    written = entries(out)  # every line parses: nothing torn
    assert 10 <= len(written) < 300 and all("result" in e for e in written)
    fake.knobs.delay_s = 0.0
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert set(successes(out)) == set(range(300)) and set(successes(out).values()) == {1}


def test_400_batch_is_resent_task_by_task(tmp_path, fake):
    lines = [task(i) for i in range(10)]
    lines[6] = task(6, labels=[" only-one"])  # contract A: classify needs >= 2 labels
    src = write_tasks(tmp_path / "tasks.jsonl", lines)
    assert main([str(src), "--router", fake.url, "--batch-size", "4"]) == 1
    got = {e["line"]: e for e in entries(tmp_path / "tasks.results.jsonl")}
    assert sorted(got) == list(range(10))
    assert got[6]["error"]["code"] == 400 and "labels" in got[6]["error"]["message"] and got[6]["id"] == "t6"
    assert all("result" in got[i] for i in range(10) if i != 6)
    statuses = [(len(b["inputs"]) if "inputs" in b else 1, s.status)
                for b, s in zip(fake.classify_bodies(), [s for s in fake.seen if s.path == "/v1/classify"])]
    assert statuses.count((4, 400)) == 1 and statuses.count((1, 400)) == 1 and statuses.count((1, 200)) == 3


def test_429_waits_retry_after_and_retries(tmp_path, fake):
    fake.knobs.busy_first = 2
    fake.knobs.retry_after = "0.4"
    src = write_tasks(tmp_path / "tasks.jsonl", [task(i) for i in range(3)])
    assert main([str(src), "--router", fake.url, "--concurrency", "1"]) == 0
    seen = [s for s in fake.seen if s.path == "/v1/classify"]
    assert [s.status for s in seen] == [429, 429, 200]
    assert seen[1].at - seen[0].at >= 0.35 and seen[2].at - seen[1].at >= 0.35
    assert set(successes(tmp_path / "tasks.results.jsonl")) == {0, 1, 2}


def test_429_beyond_busy_wait_fails_the_lines(tmp_path, fake):
    fake.knobs.busy_first = 100
    fake.knobs.retry_after = "0.2"
    src = write_tasks(tmp_path / "tasks.jsonl", [task(i) for i in range(2)])
    assert main([str(src), "--router", fake.url, "--busy-wait-s", "0.5"]) == 1
    errs = [e["error"] for e in entries(tmp_path / "tasks.results.jsonl")]
    assert len(errs) == 2 and all(e["code"] == 429 and "busy" in e["message"] for e in errs)


def test_bad_json_lines_become_error_lines(tmp_path, fake):
    src = write_tasks(tmp_path / "tasks.jsonl", [task(0), "{oops: not json", "", "[1, 2]", task(4)])
    assert main([str(src), "--router", fake.url]) == 1
    got = {e["line"]: e for e in entries(tmp_path / "tasks.results.jsonl")}
    assert sorted(got) == [0, 1, 3, 4]  # the blank line is no task
    assert "invalid JSON" in got[1]["error"]["message"] and got[1]["id"] is None
    assert "JSON object" in got[3]["error"]["message"]
    assert "result" in got[0] and "result" in got[4]
    sent = len(fake.seen)
    assert main([str(src), "--router", fake.url, "--no-retry-failed"]) == 1
    assert len(fake.seen) == sent, "nothing to send: answered lines and skipped failures"


def test_run_time_errors_are_retried_on_the_next_run(tmp_path, fake, capsys):
    fake.knobs.fail_every = 3
    src = write_tasks(tmp_path / "tasks.jsonl", [task(i) for i in range(12)])
    assert main([str(src), "--router", fake.url, "--batch-size", "5"]) == 1
    out = tmp_path / "tasks.results.jsonl"
    failed = [e["line"] for e in entries(out) if "error" in e]
    assert len(failed) == 4 and all(e["error"]["code"] == 502 for e in entries(out) if "error" in e)
    capsys.readouterr()
    fake.knobs.fail_every = 0
    before = len(fake.classify_bodies())
    assert main([str(src), "--router", fake.url, "--batch-size", "5"]) == 0
    assert "done 4, failed 0, skipped 8" in capsys.readouterr().err
    assert sorted(t["id"] for b in fake.classify_bodies()[before:] for t in b["inputs"]) == sorted(
        f"t{i}" for i in failed)
    assert set(successes(out).values()) == {1} and len(successes(out)) == 12


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, fake, capsys):
    fake.knobs.delay_s = 0.1
    src = write_tasks(tmp_path / "tasks.jsonl", [task(i) for i in range(20)])
    assert main([str(src), "--router", fake.url, "--batch-size", "2", "--concurrency", "1",
                 "--progress-interval-s", "0.25"]) == 0
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if line.startswith("classify: ") and "/20 (" in line]
    assert len(progress) >= 2 and all("\r" not in line for line in progress)
    assert "lines/s" in progress[0] and "ETA" in progress[0] and "failed 0" in progress[0]
    assert "done 20, failed 0, skipped 0" in err[-1]


def test_progress_bar_on_a_terminal_redraws_one_line():
    now = [0.0]
    stream = io.StringIO()
    p = Progress(100, stream, tty=True, clock=lambda: now[0])
    p.add(skipped=50)
    now[0] = 10.0
    p.add(ok=20, failed=5)  # 25 answered in 10 s: 2.5 lines/s, 25 left -> ETA 10 s
    text = stream.getvalue()
    assert text.startswith("\rclassify: [") and "\n" not in text
    last = text.split("\r")[-1]
    assert "75/100 (75.0%)" in last and "failed 5" in last and "2.5 lines/s" in last and "ETA 10s" in last
    assert "#" * 18 + "." * 6 in last
    p.finish("out.jsonl", interrupted=False)
    assert stream.getvalue().splitlines()[-1].startswith("classify: done 20, failed 5, skipped 50")


def test_journal_keeps_a_success_over_later_failures(tmp_path):
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    j.failure(0, "a", "boom", 502)
    j.success(0, "a", {"probs": [1.0]})
    j.failure(0, "a", "late", 502)
    j.failure(1, "b", "boom", 502)
    j.close()
    got = read_journal(path)
    assert got[0].ok and not got[1].ok and got[1].id == "b"


def test_usage_errors_exit_2_and_unreachable_router_exits_1(tmp_path, capsys):
    src = write_tasks(tmp_path / "tasks.jsonl", [task(0)])
    assert main([str(tmp_path / "missing.jsonl"), "--router", "http://127.0.0.1:1"]) == 2
    assert main([str(src), "--router", "localhost:30080"]) == 2
    assert main([str(src), "--router", "http://127.0.0.1:1", "--batch-size", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        main([str(src), "--bogus-flag"])
    assert exc.value.code == 2
    assert main([str(src), "--router", "http://127.0.0.1:1"]) == 1
    assert "cannot reach the router" in capsys.readouterr().err
    assert not (tmp_path / "tasks.results.jsonl").exists() or not entries(tmp_path / "tasks.results.jsonl")


def test_changed_input_line_is_sent_again(tmp_path, fake, capsys):
    src = write_tasks(tmp_path / "tasks.jsonl", [task(0), task(1)])
    assert main([str(src), "--router", fake.url]) == 0
    write_tasks(src, [task(0), {**task(1), "id": "renamed"}])
    assert main([str(src), "--router", fake.url]) == 0
    assert "another id" in capsys.readouterr().err
    assert [t["id"] for t in fake.classify_bodies()[-1]["inputs"]] == ["renamed"]
    assert os.path.getsize(tmp_path / "tasks.results.jsonl") > 0


def test_the_client_imports_neither_torch_nor_sglang():
    code = ("import sys, sgl_moe.classify, sgl_moe.classify.cli\n"
            "heavy = [m for m in ('torch', 'sglang', 'transformers') if m in sys.modules]\n"
            "sys.exit(f'imported {heavy}' if heavy else 0)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
