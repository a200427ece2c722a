"""A checkout's C extensions that its interpreter cannot import, found as a benchmark's ``--baseline`` runs it."""

import subprocess
import sys
from pathlib import Path

from sgl_moe.harness import native_modules

REPO = Path(__file__).resolve().parents[2]


def _checkout(root: Path, modules: dict[str, str | None]) -> Path:
    """A folder with a pyproject declaring ``modules`` as extensions; those mapped to source text exist (as Python
    modules standing in for built ones), the others do not."""
    lines = ["[project]", 'name = "probe"', ""]
    for name, source in modules.items():
        lines += ["[[tool.setuptools.ext-modules]]", f'name = "{name}"', f'sources = ["{name}.c"]', ""]
        if source is not None:
            path = root / Path(*name.split("."))
            path.parent.mkdir(parents=True, exist_ok=True)
            for parent in path.parents:
                if parent == root:
                    break
                (parent / "__init__.py").touch()
            path.with_suffix(".py").write_text(source)
    (root / "pyproject.toml").write_text("\n".join(lines))
    return root


def test_the_extensions_that_do_not_import_from_the_checkout_are_named(tmp_path):
    root = _checkout(tmp_path, {"probepkg.native_built": "X = 1\n", "probepkg.native_gone": None,
                                "probepkg.native_broken": "import no_such_module_anywhere\n"})
    assert native_modules.declared(root) == ["probepkg.native_built", "probepkg.native_gone", "probepkg.native_broken"]
    assert [name for name, _ in native_modules.missing(root)] == ["probepkg.native_gone", "probepkg.native_broken"]
    why = native_modules.refusal(root)
    assert "2 of its C extensions do not import (native_gone, native_broken)" in why
    assert "build_ext --inplace" in why and "--allow-python-fallbacks" in why


def test_a_checkout_whose_extensions_import_is_measured(tmp_path):
    assert native_modules.refusal(_checkout(tmp_path, {"probepkg.native_built": "X = 1\n"})) is None
    (tmp_path / "none").mkdir()
    assert native_modules.refusal(_checkout(tmp_path / "none", {})) is None


def test_the_benchmarks_refuse_a_baseline_without_its_extensions(tmp_path):
    """A copy of this checkout's sources without the built ``.so`` files (what ``git worktree add`` gives): both
    benchmarks that take ``--baseline`` stop with one line naming the fix, before measuring anything."""
    copy = tmp_path / "copy"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(copy), "HEAD"], cwd=REPO, check=True)
    try:
        for bench in ("router_capacity.py", "parse_path.py"):
            proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / bench), "--baseline", str(copy),
                                   "--prompt-tokens", "200"], capture_output=True, text=True, timeout=120)
            assert proc.returncode == 2, proc.stderr
            assert "C extensions do not import" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(copy)], cwd=REPO, check=True)
