"""``python -m sgl_moe.prediction.quality --model DIR`` (docs/offload.md) at its smallest size: the shipped model's
bundle evaluated on a few held-out tokens, the report printed and written as JSON."""

import json

from sgl_moe.prediction import quality


def test_quality_report_at_its_smallest_size(tmp_path, model_dir, capsys):
    out = tmp_path / "quality.json"
    quality.main(["--model", str(model_dir), "--heldout-tokens", "1024", "--speculative-tokens", "512",
                  "--hit-rate-tokens", "", "--json", str(out)])
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "|" in printed  # a markdown table
    assert result["heldout_tokens"] == 1024 and len(result["per_layer"]) == result["bundle"]["num_layers"] - 1
    assert all(0.0 <= result["mean"][kind] <= 1.0 for kind in ("router", "estimator", "hybrid"))
    # The trained estimator recalls the next layer's experts better than the router applied to the current input.
    assert result["mean"]["estimator"] > result["mean"]["router"]
    assert {row["kind"] for row in result["speculative"]} >= {"router", "estimator"}
    assert all(row["tokens"] == 512 and 0.0 <= row["top1_agreement"] <= 1.0 for row in result["speculative"])
