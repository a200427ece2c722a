"""The router's request-path modules compiled with Cython (the rest of the build is pyproject.toml's).

Each module of the router's stage folders (``router/front``, ``request``, ``placement``, ``membership``,
``replicas``) is also built as an extension from its own ``.py`` source: the same code without the interpreter's
bytecode loop (9.5% fewer instructions a shared-prefix request for the whole router, docs/router.md "Compiled
request path"). Python semantics are kept: annotations are not types (``annotation_typing`` off), so a module
behaves as its source does. Optional: without Cython or a C compiler the install goes on and the sources run;
``sgl_moe.router.compiled_modules`` runs a module's source instead of its compiled form when the source is newer
(an edit since the build) and says which at the router's start. A ``.pxd`` beside a module (``scheduler.pxd``)
declares one of its classes an extension type whose attributes the compiled methods read as struct fields.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
COMPILED_FOLDERS = ("front", "request", "placement", "membership", "replicas")
"""``router/`` folders whose modules are compiled (its top-level modules, the CLI and config, are not)."""
NOT_COMPILED = frozenset({"__init__.py"})
"""Module files left to the interpreter in those folders."""
CYTHON_DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}


def compiled_modules() -> list[Extension]:
    exts = []
    for folder in COMPILED_FOLDERS:
        for path in sorted((ROOT / "router" / folder).glob("*.py")):
            if path.name in NOT_COMPILED:
                continue
            rel = path.relative_to(ROOT).as_posix()
            exts.append(Extension(f"sgl_moe.router.{folder}.{path.stem}", [rel], optional=True,
                                  extra_compile_args=["-O2", "-g0"]))
    return exts


class BuildExt(build_ext):
    """Cython's ``build_ext`` where Cython is installed (setuptools picks it), with the directives above, the
    generated C kept out of the source tree and both cores used."""

    def finalize_options(self):
        super().finalize_options()
        if hasattr(self, "cython_directives"):
            self.cython_directives = dict(CYTHON_DIRECTIVES)
            self.cython_c_in_temp = True
            self.cython_include_dirs = [*(self.cython_include_dirs or []), str(self._package_view())]
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def _package_view(self) -> Path:
        """A folder where ``sgl_moe/router`` is ``router/``, for Cython to find a module's augmenting ``.pxd``
        (``router/placement/scheduler.pxd`` beside ``scheduler.py``): it looks one up by the module's full name,
        ``sgl_moe.router.placement.scheduler``, and the package maps ``sgl_moe.router`` to ``router/``."""
        view = Path(self.build_temp).resolve() / "cython_package_view"
        package = view / "sgl_moe"
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
        link = package / "router"
        if not link.is_symlink():
            link.symlink_to(ROOT / "router", target_is_directory=True)
        return view


setup(ext_modules=compiled_modules(), cmdclass={"build_ext": BuildExt})
