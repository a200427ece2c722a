"""The locustfile and its runner against an in-process stand-in for the router (doubles.fake_router).

The stand-in isolates the locustfile: these tests check that it replays contract B's seeded stream,
that every failure (error results, 5xx, timeouts) reaches locust's statistics with its reason, and that
the runner's CSV, summary and exit status agree with what the server saw. The live run against the
real router and workers is a separate test.
"""

import csv
from itertools import islice

import orjson
import pytest
from doubles.fake_router import FakeRouter

from sgl_moe.loadtest import traffic as lr
from sgl_moe.loadtest.runner import LoadTestConfig, main, read_stats
from sgl_moe.router.front.prefill_tasks import expand_text
from sgl_moe.workloads import WORKLOADS, WorkloadConfig, generate, to_task

USERS = 2


def first_tasks(n: int, seed: int = 0) -> list[dict]:
    return [to_task(r) for r in islice(generate(WorkloadConfig(requests=n, seed=seed)), n)]


def rows_by_name(prefix: str) -> dict:
    return {r.name: r for r in read_stats(prefix)}


def test_classify_run_replays_the_mix_and_counts_injected_failures(tmp_path, capfd):
    prefix = str(tmp_path / "out" / "run")
    with FakeRouter() as fake:
        fake.knobs.fail_every = 10
        rc = main(["--host", fake.url, "--users", str(USERS), "--run-time", "5s", "--csv", prefix,
                   "--max-failure-ratio", "0.5"])
        bodies = fake.classify_bodies()
        injected = fake.injected
    assert rc == 0
    rows = rows_by_name(prefix)
    total = rows["Aggregated"]
    # Requests cut off by the end of the run reached the server but not locust's statistics.
    assert len(bodies) - USERS <= total.requests <= len(bodies) and total.requests >= 20
    assert injected - USERS <= total.failures <= injected and total.failures >= 2
    assert {"/v1/classify moral", "/v1/classify mmlu"} <= set(rows)
    assert sum(r.requests for n, r in rows.items() if n != "Aggregated") == total.requests
    with open(f"{prefix}_failures.csv", newline="") as f:
        reasons = list(csv.DictReader(f))
    assert sum(int(r["Occurrences"]) for r in reasons) == total.failures
    assert all("injected failure" in r["Error"] for r in reasons)

    # The users share one seeded stream: together they sent the mix's first requests, each once.
    sent = [b["inputs"][0] for b in bodies]
    ids = [t["id"] for t in sent]
    assert len(set(ids)) == len(ids)
    expected = {t["id"]: t for t in first_tasks(len(sent) + USERS)}
    assert all(expected[t["id"]] == t for t in sent)

    out = capfd.readouterr().out
    assert "Aggregated" in out and f"PASS: {total.failures}/{total.requests} failed" in out


def test_generate_api_sends_prefill_units_and_fails_the_gate(tmp_path, capfd):
    prefix = str(tmp_path / "gen")
    with FakeRouter() as fake:
        fake.knobs.fail_every = 7
        rc = main(["--host", fake.url, "--users", str(USERS), "--run-time", "4s", "--csv", prefix,
                   "--api", "generate", "--workload", "mmlu,boolq"])
        seen = [s for s in fake.seen if s.path == "/generate"]
        injected = fake.injected
    assert rc == 1, "about 14% failed, above the default 1%"
    assert "FAIL:" in capfd.readouterr().out
    rows = rows_by_name(prefix)
    assert set(rows) <= {"/generate mmlu", "/generate boolq", "Aggregated"} and "/generate mmlu" in rows
    assert injected - USERS <= rows["Aggregated"].failures <= injected and rows["Aggregated"].failures > 0
    units = {u.prompt for t in first_tasks(400) for u in expand_text(t) if t["id"].startswith("mmlu")}
    mmlu = [s.body for s in seen if s.body["text"].endswith("Answer:") and "\nA. " in s.body["text"]]
    assert mmlu and all(b["text"] in units for b in mmlu[:20])
    assert all(b["sampling_params"] == {"max_new_tokens": 1, "temperature": 0} for b in (s.body for s in seen))


def test_timeouts_are_failures(tmp_path):
    prefix = str(tmp_path / "slow")
    with FakeRouter() as fake:
        fake.knobs.delay_s = 1.0
        rc = main(["--host", fake.url, "--users", "1", "--run-time", "3s", "--csv", prefix,
                   "--request-timeout-s", "0.2", "--workload", "moral"])
    assert rc == 1
    total = rows_by_name(prefix)["Aggregated"]
    assert total.requests >= 2 and total.failures == total.requests
    with open(f"{prefix}_failures.csv", newline="") as f:
        assert all("timed out" in r["Error"] for r in csv.DictReader(f))


def test_runner_usage_errors():
    assert main(["--workload", "nope"]) == 2
    assert main(["--host", "localhost:1"]) == 2
    assert main(["--max-failure-ratio", "2"]) == 2
    assert LoadTestConfig(workload="all").user_classes() == ["MoralUser", "MmluUser", "BoolqUser", "ImdbUser",
                                                             "QualityUser", "ArxivUser"]


@pytest.mark.parametrize("status, body, reason", [
    (200, {"results": [{"id": "a", "probs": [0.4, 0.6]}]}, None),
    (200, {"results": [{"id": "a", "error": {"message": "worker died", "code": 502}}]},
     "result error 502: worker died"),
    (200, {"results": []}, "malformed /v1/classify answer"),
    (200, {"results": [{"id": "a"}]}, "no probs"),
    (429, {"error": {"message": "router busy"}}, "HTTP 429: router busy"),
    (502, b"<html>bad gateway</html>", "HTTP 502: <html>bad gateway"),
])
def test_check_classify(status, body, reason):
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    got = lr.check_classify(status, raw)
    assert got == reason if reason is None else reason in got


def test_check_generate():
    assert lr.check_generate(200, orjson.dumps({"text": "x", "meta_info": {}})) is None
    assert "malformed" in lr.check_generate(200, b"not json")
    assert "HTTP 500: boom" in lr.check_generate(500, orjson.dumps({"error": {"message": "boom"}}))


def test_generate_bodies_follow_contract_a_templates():
    multi = {"id": "m", "type": "multi", "prompt": "Doc.", "choices": ["cs.AI", "math.CO"]}
    texts = [orjson.loads(b)["text"] for b in lr.generate_bodies(multi)]
    assert texts == ["Doc.\nCandidate: cs.AI\nDoes the candidate apply? Answer:",
                     "Doc.\nCandidate: math.CO\nDoes the candidate apply? Answer:"]
    choice = {"id": "c", "type": "choice", "prompt": "Q?", "choices": ["x", "y"]}
    assert [orjson.loads(b)["text"] for b in lr.generate_bodies(choice)] == ["Q?\nA. x\nB. y\nAnswer:"]


def test_stream_is_seeded_and_moves_to_the_next_seed_when_exhausted(monkeypatch):
    monkeypatch.setattr(lr, "PASS_REQUESTS", 3)
    s = lr.TaskStream(("boolq",), lr.StreamOptions(workload_seed=5))
    got = [s.next()[1] for _ in range(5)]
    first = [to_task(r) for r in generate(WorkloadConfig(workloads=("boolq",), requests=3, seed=5))]
    second = [to_task(r) for r in generate(WorkloadConfig(workloads=("boolq",), requests=3, seed=6))]
    assert got == first + second[:2] and s.passes == 1


def test_user_weights_follow_table_2():
    assert [lr.user_weight(w) for w in WORKLOADS] == [240, 240, 120, 120, 12, 6]
