"""``benchmarks/event_decode.py`` runs as docs/router.md shows it, at its smallest size: a row per batch shape with
every decoder's time (the C reader's where it was built). The figures are checked for presence, never for speed."""

import re
import subprocess
import sys
from pathlib import Path

from sgl_moe.router.membership import kv_events

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\d+) / (\d+) \| ([\d,]+) \| ([\d.]+|—) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+x|—) \| ([\d.]+)x \|$")


def test_smallest_run_prints_a_row_per_shape_with_every_decoder():
    proc = subprocess.run([sys.executable, "benchmarks/event_decode.py", "--batches", "20", "--repeats", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [m.groups() for line in proc.stdout.splitlines() if (m := ROW.match(line))]
    assert [(int(a), int(b)) for a, b, *_ in rows] == [(1, 0), (12, 12), (125, 125), (250, 0)], proc.stdout
    assert all(float(typed) > 0 and float(generic) > 0 for _, _, _, _, typed, generic, _, _ in rows)
    if kv_events.NATIVE:
        assert all(float(c) > 0 for _, _, _, c, *_ in rows)
