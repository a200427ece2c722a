"""Resolve ``sgl_moe.router`` / ``.patches`` / ``.loadtest`` when ``sgl_moe`` is imported from a source checkout.

The user's layout keeps ``router/``, ``patches/`` and ``loadtest/`` at the repository top level;
setuptools' ``package-dir`` maps them into the package in every install. But with the checkout's root on
``sys.path`` (``python -m ...`` run from the root), Python imports ``sgl_moe`` from the source folder,
which does not contain them. This finder, consulted only after the normal ones failed, maps exactly
those names to the top-level folders; it never makes ``router``, ``patches`` or ``loadtest`` importable bare.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

MAPPED = {"sgl_moe.router": "router", "sgl_moe.patches": "patches", "sgl_moe.loadtest": "loadtest"}


class SourceLayoutFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path, target=None):
        folder = MAPPED.get(fullname)
        if folder is None:
            return None
        init = self.root / folder / "__init__.py"
        if not init.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def install(package_file: str) -> None:
    root = Path(package_file).resolve().parent.parent
    if not any(isinstance(f, SourceLayoutFinder) for f in sys.meta_path):
        sys.meta_path.append(SourceLayoutFinder(root))
