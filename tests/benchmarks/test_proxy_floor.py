"""``benchmarks/proxy_floor.py`` runs as docs/router.md shows it (``.venv/bin/python benchmarks/proxy_floor.py``),
at its smallest size: every proxy once, 100 measured requests. The figures are checked for presence and for the
split adding up, never for speed (100 requests span a few of the kernel's 10 ms CPU ticks)."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROXIES = ("aiohttp server + aiohttp client", "aiohttp server + WorkerClient", "uvicorn (bare ASGI) + WorkerClient",
           "bare protocols + WorkerClient")
LINE = re.compile(r"^repeat 1  (.+?)\s+([\d.]+) ms CPU/request \(user ([\d.]+), kernel ([\d.]+)\)\s+(\d+) req/s$")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/proxy_floor.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=180)


def test_smallest_run_prints_each_proxy_cpu_with_its_user_and_kernel_split():
    proc = _run("--requests", "100", "--warmup", "20", "--concurrency", "4", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {m.group(1): m.groups()[1:] for line in proc.stdout.splitlines() if (m := LINE.match(line))}
    assert set(rows) == set(PROXIES), proc.stdout
    for name, (total, user, kernel, rate) in rows.items():
        assert abs(float(user) + float(kernel) - float(total)) <= 0.0015, (name, total, user, kernel)  # rounding
        assert int(rate) > 0, (name, rate)


def test_a_count_below_one_is_refused_in_one_line():
    proc = _run("--requests", "0")
    assert proc.returncode == 2 and "--requests, --concurrency and --repeats must be positive" in proc.stderr
    assert "Traceback" not in proc.stderr
