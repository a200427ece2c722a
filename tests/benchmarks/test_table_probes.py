"""``benchmarks/block_table_probes.py`` and ``benchmarks/piece_lookup.py`` run as docs/router.md shows them, at their
smallest sizes: a warm and a cold figure for every call. The figures are checked for presence, never for speed."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_moe.router.placement import block_tables

REPO = Path(__file__).resolve().parents[2]
FIGURE = re.compile(r"^(?:(.+?)\s+)?(warm|cold): +([\d.]+) us per (call|lookup)")


def _figures(*argv: str) -> dict[tuple[str, str], float]:
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {((m[1] or "").strip(), m[2]): float(m[3]) for line in proc.stdout.splitlines() if (m := FIGURE.match(line))}


def test_block_table_probes_prints_every_call_warm_and_cold():
    figures = _figures("benchmarks/block_table_probes.py", "--blocks", "3000", "--prompt-blocks", "10", "--calls",
                       "3", "--repeats", "1")
    calls = ["match_groups", "store + remove", "decode payload", "decode payload (msgspec alone)"]
    assert sorted(figures) == sorted((c, mode) for c in calls for mode in ("warm", "cold"))
    assert all(v > 0 for v in figures.values())


def test_piece_lookup_prints_a_warm_and_a_cold_lookup():
    figures = _figures("benchmarks/piece_lookup.py", "--prompt-tokens", "200", "--texts", "3", "--repeats", "1")
    assert sorted(figures) == [("", "cold"), ("", "warm")]
    assert all(v > 0 for v in figures.values())


def test_block_table_probes_times_another_build_beside_this_one(tmp_path):
    """``--baseline-so``: another build of the C tables (here a copy of this one) timed in turns beside this
    checkout's; both print a median and a minimum for the walk and for store + remove."""
    if not block_tables.NATIVE:
        pytest.skip("the C tables are not built here")
    other = tmp_path / "other_native_block_tables.so"
    shutil.copy(block_tables.native_block_tables.__file__, other)
    proc = subprocess.run([sys.executable, "benchmarks/block_table_probes.py", "--blocks", "3000", "--prompt-blocks",
                           "10", "--calls", "3", "--repeats", "1", "--baseline-so", str(other), "--between-mb", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^(match_groups \+ committed_prefix|store \+ remove) +(this build|baseline) *: median +([\d.]+) "
                      r"us, minimum +([\d.]+) us per call$", proc.stdout, re.M)
    assert sorted((label, build) for label, build, _, _ in rows) == sorted(
        (label, build) for label in ("match_groups + committed_prefix", "store + remove")
        for build in ("this build", "baseline"))
    assert all(float(median) >= float(low) > 0 for _, _, median, low in rows)
