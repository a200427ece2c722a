"""The router runs in a light process: it must import neither torch nor sglang; modules share public names only."""

import ast
import subprocess
import sys
from pathlib import Path

import sgl_moe.router as r


def test_router_imports_no_torch_or_sglang():
    code = (
        "import sys, pkgutil, importlib\n"
        "import sgl_moe.router as r\n"
        "for m in pkgutil.walk_packages(r.__path__, 'sgl_moe.router.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "heavy = sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'sglang', 'transformers'))\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_router_entry_point_rejects_bad_flags_in_one_line():
    for args, needle in ((["--policy", "best"], "invalid choice"), (["--queue-size", "0"], "--queue-size"),
                         (["--worker-urls", "127.0.0.1:30001"], "http://")):
        result = subprocess.run([sys.executable, "-m", "sgl_moe.router", *args], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2 and needle in result.stderr.splitlines()[-1], result.stderr


def test_router_modules_import_no_private_names():
    """Modules reuse each other through public names only (a leading underscore means: this module's own)."""
    offenders = []
    for path in sorted(Path(r.__path__[0]).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sgl_moe."):
                offenders += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not offenders, offenders
