"""The self-check's defaults fit the rank count (one GPU = one rank: host and on_demand), and asking for a
gather mode with one rank is a clear usage error, not a StreamConfigError traceback."""

import json

import pytest

from sgl_moe.streaming import selfcheck


def test_default_modes_fit_the_rank_count():
    assert selfcheck.default_modes(1) == ["host", "on_demand"]
    assert selfcheck.default_modes(2) == ["host", "on_demand", "gather", "hybrid"]


def test_one_rank_runs_the_modes_it_can(tmp_path, capsys):
    out = tmp_path / "selfcheck.json"
    assert selfcheck.main(["--ranks", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["ok"] and result["world"] == 1 and result["modes"] == ["host", "on_demand"]
    assert set(result["ranks"][0]) == {"host", "on_demand"}
    assert "need 2+ ranks" in result["note"] and "need 2+ ranks" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--ranks", "1", "--modes", "host,gather"], "gather: assemble layers from peer ranks' shards"),
    (["--modes", "bogus"], "unknown mode"),
    (["--ranks", "0"], "at least 1"),
])
def test_refusals_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        selfcheck.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
