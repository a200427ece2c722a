"""Which of the router's modules run compiled (``setup.py``: Cython over their own sources), and the source instead
of a compiled form older than it.

A compiled module is an extension next to its ``.py``; Python's import prefers the extension, so after an edit the
build's copy would run silently until the next build. ``install`` puts a finder first on ``sys.meta_path`` that,
for a module of ``sgl_moe.router``, imports the source whenever it is newer than the extension built from it
(mtimes, as Python's own bytecode cache judges); ``summary`` says at the router's start what ran how.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

PACKAGE = "sgl_moe.router."


class _FreshSource(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.compiled: list[str] = []
        """Modules imported in their compiled form."""
        self.stale: list[str] = []
        """Modules whose compiled form was older than their source: imported from the source."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(PACKAGE) or path is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return None  # a source module, or a C extension of its own (native_*): the normal finders' answer
        source = Path(spec.origin).with_name(fullname.rpartition(".")[2] + ".py")
        if not source.is_file():
            return None
        if source.stat().st_mtime > Path(spec.origin).stat().st_mtime:
            self.stale.append(fullname)
            return importlib.util.spec_from_file_location(fullname, source)
        self.compiled.append(fullname)
        return spec


_finder = _FreshSource()


def install() -> None:
    """Idempotent; called by ``sgl_moe.router``'s package init, before any of its modules is imported."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def compiled() -> list[str]:
    """The router's modules imported so far in their compiled form."""
    return list(_finder.compiled)


def stale() -> list[str]:
    """The router's modules imported from their source because their compiled form was older."""
    return list(_finder.stale)


def summary() -> str:
    """One line for the router's start: how many of the modules imported so far run compiled, and which ran from
    their source for want of a fresh build."""
    done, old = _finder.compiled, _finder.stale
    if not done and not old:
        return ("request path interpreted: the install compiled none of the router's modules (no Cython or C "
                "compiler at build time?); `bash tools/bootstrap.sh` or `pip install -e .` compiles them")
    line = f"{len(done)} of the router's modules compiled (Cython)"
    if old:
        names = ", ".join(name.removeprefix(PACKAGE) for name in old[:5]) + (", ..." if len(old) > 5 else "")
        line += (f"; {len(old)} edited since the build run from their source ({names}): rebuild with "
                 "`.venv/bin/python -m pip install --no-deps -e . --config-settings editable_mode=strict`")
    return line
