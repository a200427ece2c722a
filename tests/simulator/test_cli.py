"""``python -m sgl_moe.simulator``: the policy table, the Θ sweep and the CPU-benchmark comparison."""

import json

from sgl_moe.simulator.__main__ import main


def test_policy_table_and_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["--workers", "2", "4", "--requests", "300", "--policies", "longest_block_match", "cache_aware",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 workers, h100_30b, offline" in text and "4 workers" in text
    assert "sgl_moe longest_block_match" in text and "sglang-router cache_aware (model)" in text
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 4 and data["calibration"]["name"] == "h100_30b"
    for run in data["runs"]:
        assert run["computed_tokens"] + run["cached_tokens"] == run["prompt_tokens"]


def test_theta_sweep_shows_transfer_bound_small_theta(capsys, tmp_path):
    out = tmp_path / "sweep.json"
    assert main(["--theta-sweep", "--workers", "2", "--requests", "400", "--transfer", "nvlink",
                 "--theta-factors", "0.125", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["theta_sweep"]["rows"]
    small, large, lbm_all, rr_all = rows
    assert small["transfer_bound_steps"] > large["transfer_bound_steps"]
    assert large["throughput_rps"] > small["throughput_rps"]
    assert not lbm_all["admission"] and rr_all["policy"] == "round_robin"
    assert "Θ sweep: 2 workers, nvlink" in capsys.readouterr().out


def test_compare_prints_errors_and_ordering(tmp_path, capsys):
    bench = {"config": {"requests": 60, "workloads": "mix", "length_scale": 8.0, "seed": 0, "concurrency": 8,
                        "workers": 3},
             "results": [{"policy": "longest_block_match", "throughput_rps": 9.0, "cached_fraction": 0.5},
                         {"policy": "round_robin", "throughput_rps": 6.0, "cached_fraction": 0.2},
                         {"policy": "cache_aware", "throughput_rps": 7.0, "cached_fraction": 0.3}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    out = tmp_path / "cmp.json"
    assert main(["--compare", str(path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "CPU benchmark vs simulator (3 workers, concurrency 8, 60 tasks)" in text
    assert "ordering matches:" in text
    result = json.loads(out.read_text())["compare"]
    assert result["order_bench"] == ["longest_block_match", "cache_aware", "round_robin"]
    assert {r["policy"] for r in result["rows"]} == {"longest_block_match", "round_robin", "cache_aware"}
    for r in result["rows"]:
        assert r["rps_error"] == r["sim_rps"] / r["bench_rps"] - 1


def test_bad_arguments_fail_in_one_line(capsys):
    assert main(["--workers", "0", "--requests", "10"]) == 2
    assert capsys.readouterr().err.startswith("error:")
