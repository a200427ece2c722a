"""The calibration handshake between SGLang's HTTP process and its scheduler process, through two files.

HTTP side: ``request(min_tokens)`` then sends a long prompt; scheduler side: the first forward with at
least that many tokens is timed per layer and ``write_profile`` stores it; HTTP side: ``read_profile``.
Files are written atomically (rename), so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sgl_moe.wire import PROFILE_FILE as PROFILE
from sgl_moe.wire import PROFILE_REQUEST_FILE as REQUEST


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def request(profile_dir: str, min_tokens: int) -> None:
    _write(Path(profile_dir) / REQUEST, {"min_tokens": min_tokens})


def requested_tokens(profile_dir: str) -> int | None:
    path = Path(profile_dir) / REQUEST
    if not path.is_file():
        return None
    return int(json.loads(path.read_text())["min_tokens"])


def write_profile(profile_dir: str, tokens: int, layers: list[dict[str, float]]) -> None:
    _write(Path(profile_dir) / PROFILE, {"tokens": tokens, "layers": layers})


def read_profile(profile_dir: str) -> dict[str, Any] | None:
    path = Path(profile_dir) / PROFILE
    return json.loads(path.read_text()) if path.is_file() else None
