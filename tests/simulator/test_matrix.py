"""``python -m sgl_moe.simulator --matrix``: every scenario at smoke size, the tables, the ratios, the goal check."""

import json

import pytest

from sgl_moe.simulator.__main__ import main
from sgl_moe.simulator.matrix import add_ratios, markdown
from sgl_moe.simulator.prefix_units import PrefixStreamConfig, PrefixUnits
from sgl_moe.simulator.scenarios import MATRIX, select


def test_smoke_matrix_runs_every_scenario_and_writes_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "sim-matrix.json"
    assert main(["--matrix", "--matrix-size", "smoke", "--workers", "3", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    entries = data["matrix"]
    assert [e["scenario"] for e in entries] == [s.name for s in MATRIX]
    for e in entries:
        policies = [r["policy"] for r in e["rows"]]
        assert policies == ["longest_block_match", "round_robin", "least_flops", "cache_aware"]
        ca = e["rows"][3]
        for r in e["rows"]:
            assert r["units"] == e["requests"] and r["throughput_rps"] > 0 and 0 <= r["cached_fraction"] <= 1
            assert r["rps_vs_cache_aware"] == pytest.approx(r["throughput_rps"] / ca["throughput_rps"])
        assert "goal_met" in e["rows"][0]
    by = {e["scenario"]: e for e in entries}
    bulk = by["bulk-zipf-bounded"]
    open95 = by["open95-zipf-bounded"]
    assert open95["rate_rps"] == pytest.approx(0.95 * max(r["throughput_rps"] for r in bulk["rows"]))
    assert by["closed-zipf-bounded"]["clients"] >= 1
    # bounded pools evict, unbounded ones never do: the same stream reuses at least as much unbounded
    assert by["bulk-zipf-unbounded"]["pool_tokens"] > by["bulk-zipf-bounded"]["pool_tokens"]
    md = out.with_suffix(".md").read_text()
    assert "**3 workers**" in md and "| bulk-mix-bounded |" in md and md in capsys.readouterr().out
    assert data["summary"]["3"]["scenarios"] == len(MATRIX)


def test_selecting_an_open_loop_scenario_brings_its_capacity_source():
    assert [s.name for s in select("open80-uniform-unbounded")] == ["bulk-uniform-unbounded",
                                                                    "open80-uniform-unbounded"]
    with pytest.raises(ValueError, match="unknown scenario"):
        select("open80-nothing")


def test_bad_matrix_arguments_fail_in_one_line(capsys):
    assert main(["--matrix", "--scenarios", "nope"]) == 2
    assert main(["--matrix", "--theta-sweep"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 2 and "Traceback" not in err


def test_zipf_prefixes_are_skewed_and_uniform_ones_are_not():
    def top_share(popularity):
        units = PrefixUnits(PrefixStreamConfig(requests=2000, groups=50, prefix_tokens=64, suffix_tokens=16,
                                               popularity=popularity, seed=3))
        counts = {}
        for u in units:
            counts[u.task] = counts.get(u.task, 0) + 1
        return max(counts.values()) / 2000, units

    zipf, units = top_share("zipf")
    uniform, _ = top_share("uniform")
    assert zipf > 0.15 and uniform < 0.05
    a, b = list(units)[:2]
    assert len(a.hashes) == (64 + 16) // 16 and a.tokens == 80
    if a.task == b.task:  # same group: same prefix pages, different suffix pages
        assert a.hashes[:4] == b.hashes[:4] and a.hashes[4] != b.hashes[4]
    assert 0 < units.oracle_cached < units.prompt_tokens


def test_goal_check_names_each_miss():
    rows = [{"policy": "longest_block_match", "throughput_rps": 105.0, "cached_fraction": 0.5, "latency_p99_s": 2.0},
            {"policy": "round_robin", "throughput_rps": 90.0, "cached_fraction": 0.1, "latency_p99_s": 1.0},
            {"policy": "cache_aware", "throughput_rps": 100.0, "cached_fraction": 0.6, "latency_p99_s": 1.0}]
    add_ratios(rows)
    lbm = rows[0]
    assert not lbm["goal_met"] and len(lbm["goal_misses"]) == 4
    assert "1.05x ca < 1.1" in lbm["goal_misses"][0] and "p99 2.00x" in lbm["goal_misses"][3]
    text = markdown([{"workers": 8, "scenario": "x", "rows": rows}], "title")
    assert "| x | 105 / 90 / 100 | 1.05 | 1.17 |" in text and "missed:" in text
