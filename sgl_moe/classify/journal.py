"""The classify client's files: the JSON-lines input, and the results file kept as an append-only journal.

Every answered input line becomes one results line, written and flushed the moment it is known, so a
killed run loses only the answers still in flight. A results line is either

    {"line": N, "id": <the input's id>, "result": {...contract A result...}}            (success)
    {"line": N, "id": <the input's id>, "error": {"message": str, "code": int | null}}  (failure)

where N is the 0-based line number in the input file. On resume the journal is read back: a line with a
success entry is never sent again, so it has exactly one; a failed line is retried and gets a later entry
(readers take a line's success entry if it has one, else its last entry).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson


@dataclass(frozen=True)
class Answered:
    """What the journal already says about one input line."""

    ok: bool
    id: Any


def read_journal(path: Path) -> dict[int, Answered]:
    """Line number -> its entry (success wins over failure). Unreadable lines (a torn last write) are ignored."""
    answered: dict[int, Answered] = {}
    if not path.exists():
        return answered
    with path.open("rb") as f:
        for raw in f:
            try:
                entry = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(entry, dict) or type(entry.get("line")) is not int:
                continue
            ok = "result" in entry and "error" not in entry
            prev = answered.get(entry["line"])
            if prev is None or not prev.ok:
                answered[entry["line"]] = Answered(ok, entry.get("id"))
    return answered


def iter_input(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` for every line that is not blank; numbers count blank lines too."""
    with path.open("rb") as f:
        for n, raw in enumerate(f):
            if raw.strip():
                yield n, raw


def count_input(path: Path) -> int:
    return sum(1 for _ in iter_input(path))


def parse_task(raw: bytes) -> tuple[dict | None, str | None]:
    """``(task, None)`` or ``(None, why)``: the line must be one JSON object."""
    try:
        task = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc}"
    if not isinstance(task, dict):
        return None, f"expected a JSON object (a contract-A task), got {type(task).__name__}"
    return task, None


class Journal:
    """Appends results lines; each write is flushed at once (so a kill loses nothing written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: IO[bytes] = path.open("ab")
        # A run killed mid-write may have left a torn last line: end it so our first entry stays readable.
        if self._f.tell() > 0:
            with path.open("rb") as r:
                r.seek(-1, 2)
                if r.read(1) != b"\n":
                    self._f.write(b"\n")

    def success(self, line: int, tid: Any, result: dict) -> None:
        self._write({"line": line, "id": tid, "result": result})

    def failure(self, line: int, tid: Any, message: str, code: int | None) -> None:
        self._write({"line": line, "id": tid, "error": {"message": message, "code": code}})

    def _write(self, entry: dict) -> None:
        self._f.write(orjson.dumps(entry) + b"\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()
