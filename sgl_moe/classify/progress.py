"""Progress of a classify run on stderr: a redrawn bar on a terminal, a plain line every few seconds otherwise."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 24
TTY_REDRAW_S = 0.2
"""A terminal bar is redrawn at most this often (each draw is a write to stderr)."""


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """Counts answered lines (this run: ok, failed; earlier runs: skipped) and shows them.

    ``done`` is every line that has an answer now, whichever run wrote it; the rate and ETA use only this
    run's answers, since skipped lines cost nothing.
    """

    def __init__(self, total: int, stream: TextIO, *, tty: bool, interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.ok = 0
        self.failed = 0
        self.skipped = 0
        self.stream = stream
        self.tty = tty
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self._last_draw: float | None = None

    @property
    def answered(self) -> int:
        return self.ok + self.failed

    @property
    def done(self) -> int:
        return self.skipped + self.answered

    def elapsed(self) -> float:
        return self.clock() - self.started

    def add(self, *, ok: int = 0, failed: int = 0, skipped: int = 0) -> None:
        self.ok += ok
        self.failed += failed
        self.skipped += skipped
        self.tick()

    def line(self) -> str:
        """One status line: done/total, percentage, failures, rate, ETA."""
        elapsed = self.elapsed()
        rate = self.answered / elapsed if elapsed > 0 else 0.0
        remaining = max(self.total - self.done, 0)
        eta = _duration(remaining / rate) if rate > 0 else "?"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        text = (f"{self.done}/{self.total} ({pct:.1f}%)  failed {self.failed}  skipped {self.skipped}  "
                f"{rate:.1f} lines/s  ETA {eta}")
        if self.tty:
            filled = int(BAR_WIDTH * self.done / self.total) if self.total else BAR_WIDTH
            text = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {text}"
        return f"classify: {text}"

    def tick(self, force: bool = False) -> None:
        """Draw if the redraw interval has passed (a terminal: 0.2 s; a log: ``interval_s``)."""
        now = self.clock()
        gap = TTY_REDRAW_S if self.tty else self.interval_s
        if not force and self._last_draw is not None and now - self._last_draw < gap:
            return
        if not force and self._last_draw is None and not self.tty and now - self.started < gap:
            return  # a log gets its first line after one interval, not one per startup
        self._last_draw = now
        if self.tty:
            self.stream.write("\r" + self.line() + "\x1b[K")
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def finish(self, path: str, interrupted: bool) -> str:
        """End the bar and write the summary line; returns the summary."""
        if self.tty:
            self.tick(force=True)
            self.stream.write("\n")
        elapsed = self.elapsed()
        rate = self.answered / elapsed if elapsed > 0 else 0.0
        summary = (f"classify: {'interrupted: ' if interrupted else ''}done {self.ok}, failed {self.failed}, "
                   f"skipped {self.skipped} of {self.total} lines in {elapsed:.1f} s ({rate:.1f} lines/s); "
                   f"results in {path}")
        self.stream.write(summary + "\n")
        self.stream.flush()
        return summary
