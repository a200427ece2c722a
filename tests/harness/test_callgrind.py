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


DUMP = """# callgrind format
version: 1
positions: line
events: Ir
summary: 1111

ob=(1) /usr/bin/python3.11
fl=(1) ???
fn=(1) _PyEval_EvalFrameDefault
0 500
+3 100
cob=(2) /usr/lib/libc.so.6
cfi=(2) ???
cfn=(2) memcpy
calls=4 0
* 300
-1 10
ob=(2)
fl=(2)
fn=(2)
0 300
ob=(3) /x/native_bpe.cpython-311-x86_64-linux-gnu.so
fl=(3) native_bpe.c
fn=(3) encode
12 200
cob=(1)
cfi=(1)
cfn=(1)
calls=1 0
13 999
ob=(1)
fn=(1)
+2 1

totals: 1111
"""


def test_by_object_counts_each_functions_own_instructions_where_its_code_ran(tmp_path):
    """A call's cost line (after ``calls=``) is the callee's inclusive cost, already counted where the callee ran;
    ``cob=`` names the callee's file without leaving the caller's; ``ob=(id)`` refers to a name given before."""
    dump = tmp_path / "r.callgrind.1"
    dump.write_text(DUMP)
    by = callgrind.by_object(dump)
    assert by == {"/usr/bin/python3.11": 611, "/usr/lib/libc.so.6": 300,
                  "/x/native_bpe.cpython-311-x86_64-linux-gnu.so": 200}
    assert sum(by.values()) == callgrind.totals(dump) == 1111
