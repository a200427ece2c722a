"""Which of a checkout's C extensions its interpreter cannot import (the code then runs their Python references).

A benchmark that measures another checkout (``--baseline DIR``, e.g. ``git worktree add DIR <commit>``) runs that
checkout's modules from its folder. A worktree holds the sources but not the built ``.so`` files, so without them its
router runs every native loop in Python (page hashes ~4x slower) and a comparison is off by that, silently. The
checkout's own ``pyproject.toml`` says which extensions it declares; each is imported in a fresh interpreter run from
the checkout, as the benchmark runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

_PROBE = """
import importlib, json, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        missing.append([name, str(exc)])
print(json.dumps(missing))
"""


def declared(checkout: Path) -> list[str]:
    """The extension modules ``checkout``'s ``pyproject.toml`` declares (``[[tool.setuptools.ext-modules]]``)."""
    spec = tomllib.loads((checkout / "pyproject.toml").read_text())
    return [m["name"] for m in spec.get("tool", {}).get("setuptools", {}).get("ext-modules", [])]


def missing(checkout: Path, python: str | None = None) -> list[tuple[str, str]]:
    """(module, why) for each extension ``checkout`` declares that ``python`` (default: this interpreter), run from
    the checkout with it first on ``sys.path``, cannot import."""
    names = declared(checkout)
    if not names:
        return []
    proc = subprocess.run([python or sys.executable, "-c", _PROBE, *names], capture_output=True, text=True,
                          cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, timeout=120)
    if proc.returncode != 0:
        return [(name, f"the probe failed: {proc.stderr.strip()[-300:]}") for name in names]
    return [(name, why) for name, why in json.loads(proc.stdout.splitlines()[-1])]


def refusal(checkout: Path, python: str | None = None) -> str | None:
    """Why a benchmark should not measure ``checkout`` as it is (its extensions do not import), or None."""
    gone = missing(checkout, python)
    if not gone:
        return None
    names = ", ".join(name.rsplit(".", 1)[-1] for name, _ in gone)
    return (f"{checkout}: {len(gone)} of its C extensions do not import ({names}), so it would run their Python "
            f"references and measure slower than it is. Build them in place (a few seconds): cd {checkout} && "
            f"{python or sys.executable} -c 'from setuptools import setup; setup()' build_ext --inplace; "
            "or pass --allow-python-fallbacks to measure it as it is")
