"""Packaging: router/, patches/ and loadtest/ load only as sgl_moe.router / .patches / .loadtest; the package list is
complete."""

import importlib
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(cfg["packages"]), cfg["package-dir"]


def test_every_source_package_is_declared():
    packages, package_dir = _declared()
    found = set()
    for name, folder in package_dir.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "stub" in rel.parts or "__pycache__" in rel.parts:
                continue  # the stand-in sgl_kernel is package data, put on the path only when needed
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found <= packages, f"packages missing from pyproject.toml: {sorted(found - packages)}"


def test_top_level_folders_map_into_the_package():
    _, package_dir = _declared()
    assert package_dir["sgl_moe.router"] == "router"
    assert package_dir["sgl_moe.patches"] == "patches"
    assert package_dir["sgl_moe.loadtest"] == "loadtest"


def test_source_layout_maps_every_top_level_folder():
    from sgl_moe import _source_layout

    _, package_dir = _declared()
    assert _source_layout.MAPPED == {name: folder for name, folder in package_dir.items() if name != "sgl_moe"}


def test_bare_top_level_names_do_not_import():
    # Run away from the repository root so the working directory cannot supply them.
    code = (
        "import importlib, sys\n"
        "import sgl_moe.router, sgl_moe.patches, sgl_moe.loadtest\n"
        "for bare in ('router', 'patches', 'loadtest'):\n"
        "    try:\n"
        "        importlib.import_module(bare)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    sys.exit(f'{bare} imported as a top-level module')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + result.stdout


def test_importing_everything_never_loads_bare_names():
    import sgl_moe

    for mod in pkgutil.walk_packages(sgl_moe.__path__, "sgl_moe."):
        if mod.name.startswith("sgl_moe.training") or mod.name in ("sgl_moe.__main__", "sgl_moe.loadtest.locustfile"):
            continue  # heavy (torch), runs on import, or loaded by locust only (gevent patches the process)
        importlib.import_module(mod.name)
    for name in ("sgl_moe.router", "sgl_moe.router.request.block_hash", "sgl_moe.router.membership.kv_events",
                 "sgl_moe.patches", "sgl_moe.loadtest", "sgl_moe.loadtest.traffic"):
        importlib.import_module(name)
    assert not {"router", "patches", "loadtest", "traffic"} & set(sys.modules)


def test_shipped_model_is_packaged():
    from sgl_moe import DEFAULT_MODEL_DIR

    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer.model", "MODEL_CARD.md"):
        assert (DEFAULT_MODEL_DIR / name).is_file(), name
    assert (DEFAULT_MODEL_DIR / "model.safetensors").stat().st_size <= 30 * 1024 * 1024


def test_subpackages_resolve_when_run_from_the_checkout_root():
    # `python -m sgl_moe.router` from the repository root imports sgl_moe from the source folder.
    code = ("import sgl_moe.router.request.block_hash, sgl_moe.patches, sgl_moe.loadtest.traffic, sys\n"
            "assert not {'router', 'patches', 'loadtest'} & set(sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
