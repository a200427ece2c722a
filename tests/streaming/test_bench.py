"""The GPU benchmark harness runs end to end on a CPU at tiny sizes (the CI smoke test)."""

import json

from sgl_moe.streaming import bench


def test_tiny_benchmark_runs_every_way(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--tiny", "--layers", "3", "--sizes", "32,128", "--seq", "32",
                       "--warmup", "1", "--reps", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    ways = {(r["tokens"], r["way"]) for r in result["rows"]}
    assert ways == {(n, w) for n in (32, 128) for w in bench.WAYS}
    for r in result["rows"]:
        # Same kernels on the same bytes: every way computes exactly what the resident weights compute.
        assert r["max_abs_diff_vs_first_way"] == 0.0, r
        assert r["tokens_per_s"] > 0 and r["median_s"] > 0
    layer = result["layer_bytes"]
    streamed = [r for r in result["rows"] if r["way"] == "streamed"]
    assert all(r["expert_bytes_on_device"] == 2 * layer for r in streamed)  # window x layer
    assert all(r["expert_bytes_on_device"] == 3 * layer for r in result["rows"] if r["way"] == "resident")
    assert result["streamed_expert_bytes_equal_window_x_layer"] is True
    assert {r["tokens"] for r in result["ratios"]} == {32, 128}
    assert "| tokens |" in capsys.readouterr().out


def test_bad_arguments_are_one_line_errors(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", "--tiny", "--ways", "resident,teleport"])
    assert exc.value.code == 2 and "unknown way" in capsys.readouterr().err


def test_a_size_that_does_not_fit_is_reported_not_fatal(monkeypatch, tmp_path, capsys):
    import torch

    real = bench._measure

    def measure(model, stores, x, way, *args):
        if x.shape[0] * x.shape[1] == 128 and way == "streamed":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, stores, x, way, *args)

    monkeypatch.setattr(bench, "_measure", measure)
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--tiny", "--layers", "2", "--sizes", "32,128", "--seq", "32",
                       "--warmup", "0", "--reps", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"tokens": 128, "way": "streamed", "error": "out of memory"} in result["rows"]
    [r128] = [r for r in result["ratios"] if r["tokens"] == 128]
    assert r128["streamed_over_resident"] is None
    assert "OOM" in capsys.readouterr().out
