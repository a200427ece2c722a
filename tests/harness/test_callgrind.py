"""``callgrind.clear``: a rerun into the same folder starts without the earlier run's dumps (a new callgrind numbers
its dumps from 1 again, so a stale one made ``Counter.window`` count no new dump and fail)."""

from sgl_moe.harness import callgrind


def test_clear_removes_the_earlier_runs_dumps_and_nothing_else(tmp_path):
    out = tmp_path / "r-shared-200-0.callgrind"
    for name in ("r-shared-200-0.callgrind", "r-shared-200-0.callgrind.1", "r-shared-200-0.callgrind.2",
                 "r-shared-200-0.log", "r-shared-200-1.callgrind.1"):
        (tmp_path / name).write_text("x")
    assert len(callgrind.dumps(out)) == 2
    callgrind.clear(out)
    assert callgrind.dumps(out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-shared-200-0.log", "r-shared-200-1.callgrind.1"]
    callgrind.clear(out)  # nothing there: no error
