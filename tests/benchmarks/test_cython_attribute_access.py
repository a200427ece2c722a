"""``benchmarks/cython_attribute_access.py`` builds its three variants and reports each, at its smallest size.
Figures are checked for presence, never for speed."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_smallest_run_reports_every_variant(tmp_path):
    pytest.importorskip("Cython")
    out = tmp_path / "attr.json"
    proc = subprocess.run([sys.executable, "benchmarks/cython_attribute_access.py", "--reads", "2000", "--rounds", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())["ns_per_pass"]
    assert set(figures) == {"interpreted", "compiled_plain", "compiled_typed"} and all(v > 0 for v in figures.values())
    assert "| Cython, `cdef class` from an augmenting `.pxd` |" in proc.stdout
