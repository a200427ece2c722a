"""The offload decode benchmark runs end to end on a CPU at tiny sizes (the CI smoke test)."""

import json

import pytest

from sgl_moe.offload import bench


def _run(tmp_path, *extra):
    out = tmp_path / "offload.json"
    assert bench.main(["--device", "cpu", "--tiny", "--layers", "3", "--batches", "1,2", "--context", "32",
                       "--warmup", "1", "--steps", "2", "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_tiny_benchmark_runs_every_mode(tmp_path, capsys):
    result = _run(tmp_path, "--hit-rate-json", str(tmp_path / "missing.json"), "--resident-experts", "2")
    assert "not found" in result["hit_rate_source"]
    assert [r["batch"] for r in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert set(row["modes"]) == set(bench.MODES)
        # Same experts, same bytes: on_demand and exact compute exactly what resident experts compute.
        assert row["modes"]["on_demand"]["max_abs_diff"] == 0.0
        assert row["modes"]["exact"]["max_abs_diff"] == 0.0
        assert all(m["tpot_s"] > 0 for m in row["modes"].values())
        assert len(row["copy_s_per_layer"]) == len(row["compute_s_per_layer"]) == 3
        assert row["bound_s"] >= 0 and row["modes"]["speculative"]["stats_per_step"]["misses"] >= 0
        stats = row["modes"]["exact"]["stats_per_step"]
        assert stats["bytes_moved"] == pytest.approx(stats["experts_copied"] * result["expert_bytes"])
        assert stats["resident_hits"] > 0
    printed = capsys.readouterr()
    assert "| batch |" in printed.out and "CUDA graphs: not used" in printed.out


def test_hit_rates_come_from_the_prediction_quality_file(tmp_path):
    path = tmp_path / "quality.json"
    path.write_text(json.dumps({"per_layer": [{"hybrid": 1.0}, {"hybrid": 0.5}]}))
    result = _run(tmp_path, "--hit-rate-json", str(path))
    assert result["hit_rates"] == [0.0, 1.0, 0.5]
    assert str(path) in result["hit_rate_source"]


def test_bad_arguments_are_one_line_errors(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", "--tiny", "--batches", "1,x"])
    assert exc.value.code == 2 and "comma-separated" in capsys.readouterr().err
