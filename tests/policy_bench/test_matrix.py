"""The scenario matrix's machinery (issue 18): streams, verdicts, and a smoke run of every arrival process
against stand-in HTTP workers. These test the harness, not performance: the stand-ins' figures mean nothing."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import pytest

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.policy_bench import matrix
from sgl_moe.policy_bench.prefix_stream import PrefixStreamConfig, build_prefix_stream
from sgl_moe.policy_bench.report import matrix_table, median_row, run_ratios, verdict
from sgl_moe.policy_bench.scenarios import MATRIX, Sizes, select
from sgl_moe.policy_bench.stream import StreamUnit
from sgl_moe.router.request.router_tokenizer import RouterTokenizer


@pytest.fixture(scope="module")
def tok() -> RouterTokenizer:
    return RouterTokenizer.from_files((DEFAULT_MODEL_DIR / "tokenizer.json").read_bytes(),
                                      json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text()))


def test_prefix_stream_is_seeded_and_shares_exact_prefixes(tok):
    cfg = PrefixStreamConfig(requests=60, groups=6, prefix_tokens=64, suffix_tokens=16, seed=3)
    a, b = build_prefix_stream(cfg, tok), build_prefix_stream(cfg, tok)
    assert [u.text for u in a] == [u.text for u in b]
    assert [u.text for u in build_prefix_stream(PrefixStreamConfig(**{**vars(cfg), "seed": 4}), tok)] != [
        u.text for u in a]
    by_group: dict[str, list] = {}
    for u in a:
        by_group.setdefault(u.task_id.split("/")[0], []).append(tok.encode(u.text))
    for ids in by_group.values():  # same group: the same first 64 tokens, then different suffixes
        assert all(x[:64] == ids[0][:64] for x in ids)
    assert len({tuple(x) for x in sum(by_group.values(), [])}) == 60


def test_zipf_is_skewed_and_uniform_is_not(tok):
    def top_share(popularity: str) -> float:
        units = build_prefix_stream(PrefixStreamConfig(requests=600, groups=12, prefix_tokens=16, suffix_tokens=16,
                                                       popularity=popularity), tok)
        counts = Counter(u.task_id.split("/")[0] for u in units)
        return counts.most_common(1)[0][1] / len(units)

    assert top_share("zipf") > 0.25 > 0.15 > top_share("uniform")


def test_bounded_pools_hold_a_third_of_the_prefix_set():
    s = Sizes()
    assert s.groups("bounded") * s.prefix_tokens >= 3 * s.pool_tokens - s.prefix_tokens
    assert s.groups("unbounded") * s.prefix_tokens <= s.pool_tokens // 2


def test_selecting_an_open_loop_scenario_brings_its_capacity_source():
    names = [s.name for s in select("open80-zipf-bounded")]
    assert names == ["bulk-zipf-bounded", "open80-zipf-bounded"]
    assert {s.arrival for s in MATRIX} == {"closed", "open", "bulk"}
    with pytest.raises(ValueError, match="unknown scenario"):
        select("nope")


def _row(policy: str, rps: float, cached: float, p99: float, failures: int = 0) -> dict:
    return {"policy": policy, "throughput_rps": rps, "cached_fraction": cached, "latency_p99_ms": p99,
            "failures": failures}


def test_verdict_judges_every_goal():
    rows = [_row("longest_block_match", 2.2, 0.6, 1100), _row("cache_aware", 2.0, 0.6, 1000),
            _row("round_robin", 1.6, 0.3, 900)]
    v = verdict(rows, "closed")
    assert v["met"] and v["rps_vs_cache_aware"] == pytest.approx(1.1)
    assert v["rps_vs_round_robin"] == pytest.approx(1.375)
    rows[0] = _row("longest_block_match", 2.1, 0.59, 1300)
    v = verdict(rows, "closed")
    assert not v["met"] and {k for k, ok in v["checks"].items() if not ok} == {
        "rps_vs_cache_aware", "cached_vs_cache_aware", "p99_vs_cache_aware"}


def test_open_loop_judges_reuse_and_p99_not_throughput():
    rows = [_row("longest_block_match", 0.9, 0.6, 500), _row("cache_aware", 1.0, 0.5, 600),
            _row("round_robin", 0.98, 0.3, 900)]
    v = verdict(rows, "open")
    assert v["met"] and "rps_vs_cache_aware" not in v["checks"] and v["rps_vs_cache_aware"] == pytest.approx(0.9)
    rows[0] = _row("longest_block_match", 0.9, 0.6, 900)  # fell behind: its p99 shows it
    assert not verdict(rows, "open")["checks"]["p99_vs_cache_aware"]


def test_repeated_runs_are_judged_on_their_medians_and_keep_every_run():
    ours = [_row("longest_block_match", r, 0.6, 1000) for r in (2.0, 3.0, 2.4)]
    ca = [_row("cache_aware", r, 0.6, 1000) for r in (2.0, 2.0, 4.0)]
    for row in ours + ca:
        row["requests"] = 10
    rows = [median_row(ours), median_row(ca)]
    assert rows[0]["throughput_rps"] == 2.4 and rows[1]["throughput_rps"] == 2.0 and rows[0]["requests"] == 30
    assert [r["throughput_rps"] for r in rows[0]["runs"]] == [2.0, 3.0, 2.4]
    assert verdict(rows, "closed")["rps_vs_cache_aware"] == pytest.approx(1.2)
    assert run_ratios(rows) == pytest.approx([1.0, 1.5, 0.6])


def test_router_cpu_per_request_is_the_median_of_the_runs_and_shown_in_the_table():
    runs = [_row("longest_block_match", 2.0, 0.6, 1000) for _ in range(3)]
    for row, cpu_s in zip(runs, (0.5, 1.5, 1.0)):
        row["requests"], row["router_stats"] = 500, {"router_cpu_s": cpu_s}
    row = median_row(runs)
    assert row["router_cpu_ms_per_request"] == pytest.approx(2.0)  # 1.0 s over 500 requests
    unmeasured = median_row([{**_row("cache_aware", 2.0, 0.6, 1000), "requests": 500,
                              "router_stats": {"router_cpu_s": None}}])
    assert unmeasured["router_cpu_ms_per_request"] is None
    for r in (row, unmeasured):
        r["router"], r["latency_p50_ms"] = r["policy"], 100.0
    table = matrix_table([{"name": "s", "results": [row, unmeasured], "verdict": {}}])
    assert "| 2.00 |" in table.splitlines()[2] and "| – |" in table.splitlines()[3]


@pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None, reason="sglang-router is not installed")
def test_smoke_matrix_repeats_a_scenario_with_the_routers_rotated(tmp_path, capsys):
    out = tmp_path / "m.json"
    # Two routers (the two the per-run ratio compares) rotate as three do; a third adds two router starts.
    rc = matrix.main(["--smoke", "--scenarios", "closed-zipf-unbounded", "--repeats", "2", "--routers",
                      "longest_block_match", "cache_aware", "--out", str(out), "--log-dir", str(tmp_path / "logs")])
    assert rc == 0
    sc = json.loads(out.read_text())["scenarios"][0]
    assert [r["policy"] for r in sc["results"]] == ["longest_block_match", "cache_aware"]
    assert [len(r["runs"]) for r in sc["results"]] == [2, 2]
    assert len(sc["verdict"]["runs_rps_vs_cache_aware"]) == 2
    order = [line.split(":")[0].strip() for line in capsys.readouterr().err.splitlines() if "(run " in line]
    first, second = order[:2], [x.replace("run 2", "run 1") for x in order[2:]]
    assert len(order) == 4 and first != second and sorted(first) == sorted(second)  # the same routers, rotated
    assert "run 2 times" in out.with_suffix(".md").read_text()


@pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None, reason="sglang-router is not installed")
def test_smoke_matrix_runs_every_router_and_arrival(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = matrix.main(["--smoke", "--scenarios", "open50-zipf-bounded,closed-mix", "--out", str(out),
                      "--log-dir", str(tmp_path / "logs")])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["smoke"] and [s["name"] for s in result["scenarios"]] == [
        "bulk-zipf-bounded", "open50-zipf-bounded", "closed-mix"]
    for sc in result["scenarios"]:
        assert [r["policy"] for r in sc["results"]] == list(matrix.ROUTERS)
        for r in sc["results"]:
            assert r["failures"] == 0 and r["requests"] == sc["stream"]["requests"] and r["throughput_rps"] > 0
        assert "rps_vs_cache_aware" in sc["verdict"] and "checks" in sc["verdict"]
    bulk, open50 = result["scenarios"][0], result["scenarios"][1]
    assert open50["offered_rps"] == pytest.approx(0.5 * max(r["throughput_rps"] for r in bulk["results"]))
    # The stand-ins' caches are bounded and placement-dependent: cache-aware routing finds some reuse.
    assert any(r["cached_fraction"] > 0 for sc in result["scenarios"] for r in sc["results"])
    md = out.with_suffix(".md").read_text()
    assert "SMOKE" in md and "| bulk-zipf-bounded | sgl_moe longest_block_match |" in md


def test_the_warm_up_shares_no_prefix_with_the_stream_or_itself():
    shared = "You are a careful moderator. Decide whether the message below breaks the rules. " * 3
    units = [StreamUnit(f"t{i}", "w", shared + f"message {i}", 60 + i) for i in range(10)]
    warm = matrix.warmup_units(units, seed=1)
    assert len(warm) == matrix.WARMUP_REQUESTS and [w.prompt_tokens for w in warm] == [u.prompt_tokens for u in
                                                                                       units[:len(warm)]]
    heads = {w.text[:40] for w in warm}
    assert len(heads) == len(warm) and not any(u.text.startswith(w.text[:12]) for u in units for w in warm)
    assert sorted(warm[0].text.split(": ", 1)[1].split()) == sorted(units[0].text.split())  # same words, shuffled
    assert matrix.warmup_units(units, seed=1) == warm and matrix.warmup_units(units, seed=2) != warm
