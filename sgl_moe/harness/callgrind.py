"""Counting a process's instructions with valgrind's callgrind, over windows the caller chooses.

A process started under ``command(out)`` runs uninstrumented (``--instr-atstart=no``); ``Counter.window`` turns
instrumentation on, and on leaving dumps what was counted and turns it off again. Instructions are a proxy for CPU
time that this noisy 2-core VM cannot blur (the same run twice agreed within 0.2%), not a measure of it: code
valgrind runs differently (OpenSSL's SHA-256 without SHA instructions, for one) counts high. ``by_object`` splits a
window's count by the executable or library whose code ran it.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def available() -> bool:
    return bool(shutil.which("valgrind") and shutil.which("callgrind_control"))


def command(out_file: Path) -> list[str]:
    """The prefix that runs a command under callgrind, uninstrumented until told, dumping to ``out_file``.N."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}"]


def control(pid: int, *args: str) -> None:
    """``callgrind_control ARGS PID`` (``-i on``, ``-i off``, ``-d NAME``)."""
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=600)


def clear(out_file: Path) -> None:
    """Remove an earlier run's ``out_file`` and its dumps: a new callgrind numbers its dumps from 1 again, over them,
    so a stale dump would make ``Counter.window`` see no new one."""
    for f in [out_file, *dumps(out_file)]:
        f.unlink(missing_ok=True)


def dumps(out_file: Path) -> list[Path]:
    """The dumps written so far, oldest first."""
    return [Path(f) for f in sorted(glob.glob(f"{out_file}.*"), key=lambda f: int(f.rsplit(".", 1)[1]))]


def totals(dump: Path) -> int:
    """The instructions a dump counted (its ``totals:`` line)."""
    with open(dump) as f:
        for line in f:
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise ValueError(f"{dump} has no totals line")


class Counter:
    """The instructions of one process under ``command(out_file)``, window by window."""

    def __init__(self, pid: int, out_file: Path) -> None:
        self.pid = pid
        self.out_file = out_file
        self.last_dump: Path | None = None
        """The dump of the last window left (``by_object`` reads where its instructions ran)."""

    @contextmanager
    def window(self, name: str) -> Iterator[list[int]]:
        """Count while inside; the list holds the window's instructions once left. The dump is asked for before
        instrumentation stops (one asked for after ``-i off`` is never taken); the calls' own instructions count."""
        got: list[int] = []
        before = len(dumps(self.out_file))
        control(self.pid, "-i", "on")
        yield got
        control(self.pid, "-d", name)
        control(self.pid, "-i", "off")
        files = dumps(self.out_file)
        if len(files) != before + 1:
            raise RuntimeError(f"callgrind wrote {len(files) - before} dumps for window {name!r} ({self.out_file})")
        self.last_dump = files[-1]
        got.append(totals(files[-1]))


def by_object(dump: Path) -> dict[str, int]:
    """The instructions a dump counted, by the file (executable or shared library) whose code ran them: each
    function's own instructions, the calls it made counted where they ran. Sums to ``totals``."""
    names: dict[str, str] = {}
    spent: dict[str, int] = {}
    current = "???"
    after_call = False
    with open(dump) as f:
        for line in f:
            head = line[:1]
            if head.isdigit() or head in "+-*":
                if after_call:  # the cost line of a ``calls=`` line: the callee's inclusive cost, counted there
                    after_call = False
                    continue
                parts = line.split()
                if len(parts) > 1:
                    spent[current] = spent.get(current, 0) + int(parts[1])
            elif line.startswith("calls="):
                after_call = True
            elif line.startswith(("ob=", "cob=")):
                ref, _, name = line.partition("=")[2].rstrip("\n").partition(" ")
                if ref.startswith("("):  # name compression: "(id) name" defines, "(id)" refers
                    if name:
                        names[ref] = name
                    name = names.get(ref, ref)
                else:
                    name = line.partition("=")[2].strip()
                if line.startswith("ob="):
                    current = name
    return spent
