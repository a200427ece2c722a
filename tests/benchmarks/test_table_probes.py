"""``benchmarks/block_table_probes.py`` and ``benchmarks/piece_lookup.py`` run as docs/router.md shows them, at their
smallest sizes: a warm and a cold figure for every call. The figures are checked for presence, never for speed."""

import re
import subprocess
import sys
from pathlib import Path

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
