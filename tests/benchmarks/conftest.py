"""Shared by the benchmark tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.fixture
def marked_python(tmp_path: Path) -> tuple[Path, Path]:
    """(interpreter, marker): this interpreter through a script that creates ``marker`` when it runs, for
    ``--baseline-python`` (the test then knows the baseline ran on the interpreter it was given)."""
    marker = tmp_path / "baseline-python-ran"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/bash\ntouch {marker}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python, marker
