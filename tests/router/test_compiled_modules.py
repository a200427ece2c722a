"""The router's stage modules run compiled (setup.py, Cython) where the install had a compiler, and a module edited
since its build runs from its source (``sgl_moe.router.compiled_modules``)."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from sgl_moe.router import compiled_modules
from sgl_moe.router.request import token_ids

HAVE_CC = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))
COMPILED = token_ids.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler on PATH: the sources run, as they should")
def test_the_request_path_is_compiled_where_a_compiler_is():
    """A build that silently fell back to the sources (Cython missing from the build requirements, a module Cython
    refuses) would lose the compiled path's ~10% without a word: where a compiler is, require it."""
    names = ["front.service", "front.http_server", "front.worker_client", "request.request_parsing",
             "request.prefix_memo", "placement.scheduler", "membership.event_listener"]
    out = subprocess.run(
        [sys.executable, "-c",
         "import importlib, sys, sgl_moe.router.compiled_modules as c\n"
         "for m in sys.argv[1:]:\n"
         "    importlib.import_module('sgl_moe.router.' + m)\n"
         "print(c.summary()); print(' '.join(c.compiled() + c.stale()))", *names],
        capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    built = set(out[-1].split())  # compiled, or compiled and edited since (then run from the source)
    assert {f"sgl_moe.router.{m}" for m in names} <= built, out
    assert "compiled (Cython)" in out[0], out


@pytest.fixture
def probe_package(tmp_path):
    """``sgl_moe.router.probe_pkg`` holding a copy of a compiled module and its source (``token_ids``)."""
    if not COMPILED:
        pytest.skip("this install did not compile the router's modules")
    pkg = tmp_path / "probe_pkg"
    pkg.mkdir()
    so = Path(token_ids.__file__)
    shutil.copy2(so, pkg / so.name)
    shutil.copy2(so.with_name("token_ids.py"), pkg / "token_ids.py")
    module = types.ModuleType("sgl_moe.router.probe_pkg")
    module.__path__ = [str(pkg)]
    sys.modules["sgl_moe.router.probe_pkg"] = module
    yield pkg, so.name
    for name in ("sgl_moe.router.probe_pkg.token_ids", "sgl_moe.router.probe_pkg"):
        sys.modules.pop(name, None)


def _import_fresh(name: str):
    sys.modules.pop(name, None)
    importlib.invalidate_caches()
    return importlib.import_module(name)


def test_a_compiled_module_newer_than_its_source_is_imported_compiled(probe_package):
    pkg, so_name = probe_package
    os.utime(pkg / "token_ids.py", (1_000_000_000, 1_000_000_000))
    module = _import_fresh("sgl_moe.router.probe_pkg.token_ids")
    assert module.__file__ == str(pkg / so_name)
    assert "sgl_moe.router.probe_pkg.token_ids" in compiled_modules.compiled()


def test_a_source_edited_since_the_build_is_imported_instead(probe_package):
    pkg, _ = probe_package
    source = pkg / "token_ids.py"
    source.write_text(source.read_text() + "\nEDITED_SINCE_THE_BUILD = True\n")
    module = _import_fresh("sgl_moe.router.probe_pkg.token_ids")
    assert module.__file__ == str(source) and module.EDITED_SINCE_THE_BUILD
    assert "sgl_moe.router.probe_pkg.token_ids" in compiled_modules.stale()
    assert "probe_pkg.token_ids" in compiled_modules.summary() and "rebuild" in compiled_modules.summary()


def test_the_finder_leaves_other_packages_and_c_extensions_to_the_normal_import():
    finder = next(f for f in sys.meta_path if type(f).__name__ == "_FreshSource")
    assert finder.find_spec("json.decoder", None) is None
    from sgl_moe.router.request import native_page_hash

    parent = sys.modules["sgl_moe.router.request"]
    assert finder.find_spec("sgl_moe.router.request.native_page_hash", parent.__path__) is None
    assert native_page_hash.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler on PATH: the sources run, as they should")
def test_every_pxd_class_is_an_extension_type_once_compiled():
    """A ``.pxd`` that Cython does not find (looked up by the module's full name) or a module it then fails to build
    is dropped without a word; where a compiler is, each declared class must come out an extension type whose
    declared attributes are slots."""
    import re

    root = Path(compiled_modules.__file__).resolve().parent
    pxds = sorted(root.glob("*/*.pxd"))
    assert pxds
    for pxd in pxds:
        text = pxd.read_text()
        name = f"sgl_moe.router.{pxd.parent.name}.{pxd.stem}"
        module = importlib.import_module(name)
        if name in compiled_modules.stale():
            continue  # edited since the build: runs from its source (the test above covers the build itself)
        for cls, body in re.findall(r"cdef class (\w+):\n((?:    .*\n)+)", text):
            for attr in re.findall(r"cdef public object (\w+)", body):
                kind = type(getattr(module, cls).__dict__.get(attr)).__name__
                assert kind == "getset_descriptor", (name, cls, attr, kind, module.__file__)
