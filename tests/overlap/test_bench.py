"""The CPU smoke run of the benchmark writes its JSON and table."""

import json

from sgl_moe.overlap import bench


def test_tiny_bench_writes_json(tmp_path, capsys):
    out = tmp_path / "overlap.json"
    assert bench.main(["--device", "cpu", "--tiny", "--batches", "2,4", "--prefill", "2x8", "--layers", "2",
                       "--reps", "1", "--force-overlap", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["cpu-experts"]["rows"]
    assert [r["batch"] for r in rows] == [2, 4] and all(r["plan"]["overlap"] for r in rows)
    assert all(r["diff_vs_serial_split"] == 0.0 for r in rows + result["streams"]["rows"])
    assert result["cpu-experts"]["doubled"][0]["batch_dual"] == 4
    assert result["solver_median_us_b256"] < 1000
    assert "| batch | T_a ms" in capsys.readouterr().out
