"""``python -m sgl_moe.loadtest --host URL``: run the locust load test headless, summarise it, gate on failures.

Runs ``locust -f <this package>/locustfile.py --headless`` with the user class(es) of ``--workload``, writes
locust's CSV files under the ``--csv`` prefix, prints one line per statistics row (requests, failures,
requests/s, p50, p99) and the commonest failure reasons, and exits 1 when the failure ratio exceeds
``--max-failure-ratio`` (default 0.01: a load test tolerates the odd failure, e.g. a request cut off by
a worker restart, but not a systematic one) or when no request completed; 2 when locust itself could
not run (bad options, locustfile error) or for a bad flag.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sgl_moe.cli_args import add_dataclass_args, from_namespace

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
"""The package's locustfile (installed with it, beside this module)."""

CLASS_OF = {"mix": "MixUser", "moral": "MoralUser", "mmlu": "MmluUser", "boolq": "BoolqUser",
            "imdb": "ImdbUser", "quality": "QualityUser", "arxiv": "ArxivUser"}
"""``--workload`` name -> locust user class; ``all`` runs the six per-workload classes by Table 2 weight."""


@dataclass(frozen=True)
class LoadTestConfig:
    host: str = "http://127.0.0.1:30080"
    """Base URL of the router under test."""
    users: int = 8
    """Concurrent closed-loop users."""
    spawn_rate: float = 8.0
    """Users started per second."""
    run_time: str = "60s"
    """How long to run (locust syntax: 30s, 5m, 1h30m)."""
    csv: str = "loadtest-results/run"
    """Prefix of locust's CSV files (<prefix>_stats.csv, _failures.csv, _exceptions.csv, _stats_history.csv)."""
    workload: str = "mix"
    """mix (the aggregated workload, one stream), all (the six per-workload users weighted by Table 2), or
    comma-separated names among moral, mmlu, boolq, imdb, quality, arxiv."""
    api: Literal["classify", "generate"] = "classify"
    """classify: POST /v1/classify per task; generate: POST /generate (max_new_tokens=1) per prefill unit."""
    workload_scale: float = 8.0
    """Divide Table 2 context lengths by this."""
    workload_seed: int = 0
    """Seed of the workload streams."""
    request_timeout_s: float = 600.0
    """A request not answered within this time is a failure."""
    max_failure_ratio: float = 0.01
    """Exit 1 if failures / requests exceeds this."""
    locustfile: str = str(LOCUSTFILE)
    """The locustfile to run."""

    def user_classes(self) -> list[str]:
        names = [w.strip() for w in self.workload.split(",") if w.strip()]
        if names == ["all"]:
            return [c for w, c in CLASS_OF.items() if w != "mix"]
        unknown = [w for w in names if w not in CLASS_OF]
        if unknown or not names:
            raise ValueError(f"--workload must be mix, all or names among {', '.join(list(CLASS_OF)[1:])}; "
                             f"got {self.workload!r}")
        return [CLASS_OF[w] for w in names]

    def validate(self) -> None:
        self.user_classes()
        if not self.host.startswith(("http://", "https://")):
            raise ValueError(f"--host must be an http:// or https:// URL, got {self.host!r}")
        if self.users < 1 or not self.spawn_rate > 0:
            raise ValueError("--users must be >= 1 and --spawn-rate positive")
        if not 0 <= self.max_failure_ratio <= 1:
            raise ValueError(f"--max-failure-ratio must be in [0, 1], got {self.max_failure_ratio}")
        if not Path(self.locustfile).is_file():
            raise ValueError(f"locustfile {self.locustfile} not found")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "locust", "-f", self.locustfile, "--headless", "--only-summary",
                "-H", self.host, "-u", str(self.users), "-r", str(self.spawn_rate), "-t", self.run_time,
                "--csv", self.csv, "--api", self.api, "--workload-scale", str(self.workload_scale),
                "--workload-seed", str(self.workload_seed), "--request-timeout", str(self.request_timeout_s),
                *self.user_classes()]


@dataclass(frozen=True)
class Row:
    """One row of ``<prefix>_stats.csv``."""

    name: str
    requests: int
    failures: int
    rps: float
    p50_ms: float
    p99_ms: float

    @property
    def failure_ratio(self) -> float:
        return self.failures / self.requests if self.requests else 0.0


def _num(value: str) -> float:
    return float(value) if value not in ("", "N/A") else float("nan")


def read_stats(prefix: str) -> list[Row]:
    """Rows of ``<prefix>_stats.csv``; the last one is locust's ``Aggregated``."""
    with open(f"{prefix}_stats.csv", newline="") as f:
        return [Row(r["Name"], int(r["Request Count"]), int(r["Failure Count"]), _num(r["Requests/s"]),
                    _num(r["50%"]), _num(r["99%"])) for r in csv.DictReader(f)]


def read_failures(prefix: str) -> list[tuple[str, str, int]]:
    """``(name, error, occurrences)`` from ``<prefix>_failures.csv``, commonest first."""
    path = Path(f"{prefix}_failures.csv")
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = [(r["Name"], r["Error"], int(r["Occurrences"])) for r in csv.DictReader(f)]
    return sorted(rows, key=lambda r: -r[2])


def summary(rows: list[Row], failures: list[tuple[str, str, int]]) -> str:
    lines = [f"{'name':<28} {'requests':>9} {'failures':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}"]
    for r in rows:
        lines.append(f"{r.name or '-':<28} {r.requests:>9} {r.failures:>9} {r.rps:>8.2f} {r.p50_ms:>8.0f} "
                     f"{r.p99_ms:>8.0f}")
    for name, error, n in failures[:5]:
        lines.append(f"failure x{n}: {name}: {error}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_moe.loadtest", description=__doc__.split("\n\n")[0])
    add_dataclass_args(parser, LoadTestConfig, prefix="", title="load test")
    cfg = from_namespace(LoadTestConfig, parser.parse_args(argv), "")
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(cfg.csv).parent.mkdir(parents=True, exist_ok=True)
    stats = Path(f"{cfg.csv}_stats.csv")
    stats.unlink(missing_ok=True)  # a stale file must not pass for this run's
    print("running: " + " ".join(cfg.command()), file=sys.stderr, flush=True)
    rc = subprocess.run(cfg.command()).returncode
    if not stats.exists():
        print(f"error: locust exited {rc} without writing {stats}", file=sys.stderr)
        return 2
    rows = read_stats(cfg.csv)
    total = rows[-1]
    print(summary(rows, read_failures(cfg.csv)))
    if total.requests == 0:
        print("FAIL: no request completed", file=sys.stderr)
        return 1
    verdict = total.failure_ratio <= cfg.max_failure_ratio
    print(f"{'PASS' if verdict else 'FAIL'}: {total.failures}/{total.requests} failed "
          f"({100 * total.failure_ratio:.2f}%, allowed {100 * cfg.max_failure_ratio:.2f}%); "
          f"{total.rps:.2f} req/s, p50 {total.p50_ms:.0f} ms, p99 {total.p99_ms:.0f} ms; CSVs: {cfg.csv}_*.csv")
    return 0 if verdict else 1


if __name__ == "__main__":
    raise SystemExit(main())
