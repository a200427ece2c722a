"""``tools/bootstrap.sh`` makes ``.venv`` on the fastest Python 3.11 it finds (``--pick-python`` says which)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = sys._base_executable  # type: ignore[attr-defined]  # a Python 3.11 with venv and ensurepip


def _stub(path: Path, seconds: str) -> None:
    """An interpreter that is ``REAL`` in everything but its name and its time on ``tools/python_speed.py``."""
    path.write_text(f"""#!/bin/bash
case "$*" in
  *python_speed.py*) echo {seconds} ;;
  *realpath*) echo "$0" ;;
  *) exec {REAL} "$@" ;;
esac
""")
    path.chmod(0o755)


def _pick(path_dirs: list[Path], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "tools" / "bootstrap.sh"), "--pick-python"], capture_output=True,
                          text=True, env={**os.environ, "PATH": os.pathsep.join(map(str, path_dirs)), **env})


def _timed(stderr: str) -> list[tuple[str, float]]:
    return [(m[1], float(m[2])) for m in re.finditer(r"^\[bootstrap\] (\S+) \(Python 3\.11\.\d+\): ([\d.]+) s",
                                                      stderr, re.M)]


def test_python_speed_prints_seconds() -> None:
    out = subprocess.run([sys.executable, str(REPO / "tools" / "python_speed.py")], capture_output=True, text=True,
                         check=True).stdout
    assert 0 < float(out) < 30


def _expected(timed: list[tuple[str, float]]) -> str:
    """The rule: the first found, replaced by a later one only when it is 10% faster than the one kept so far."""
    best_exe, best_t = timed[0]
    for exe, t in timed[1:]:
        if t < 0.9 * best_t:
            best_exe, best_t = exe, t
    return best_exe


def _resolved(name: str, path_dirs: list[Path]) -> str:
    """The executable ``pick_python``'s answer names, as it identifies interpreters (the stubs: their own path)."""
    return subprocess.run([name, "-c", "import os, sys; print(os.path.realpath(sys.executable))"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PATH": os.pathsep.join(map(str, path_dirs))}).stdout.strip()


TOOLS = [Path("/usr/bin"), Path("/bin")]
"""bash, awk; and whatever Python 3.11 this machine has there, which is timed too."""


def test_the_fastest_interpreter_is_picked(tmp_path: Path) -> None:
    slow, fast = tmp_path / "a", tmp_path / "b"
    slow.mkdir()
    fast.mkdir()
    _stub(slow / "python3.11", "0.500")  # found first
    _stub(fast / "python3", "0.010")
    dirs = [slow, fast, *TOOLS]
    done = _pick(dirs)
    assert done.returncode == 0, done.stderr
    timed = _timed(done.stderr)
    assert (str(slow / "python3.11"), 0.5) in timed and (str(fast / "python3"), 0.01) in timed
    assert _resolved(done.stdout.strip(), dirs) == _expected(timed) == str(fast / "python3")


def test_a_close_second_does_not_displace_the_first(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _stub(first / "python3.11", "0.010")
    _stub(second / "python3", "0.0095")  # 5% faster: not enough
    dirs = [first, second, *TOOLS]
    done = _pick(dirs)
    assert done.returncode == 0, done.stderr
    timed = _timed(done.stderr)
    assert (str(second / "python3"), 0.0095) in timed
    assert _resolved(done.stdout.strip(), dirs) == _expected(timed) == str(first / "python3.11")


def test_python_set_decides_and_is_checked(tmp_path: Path) -> None:
    assert _pick(TOOLS, PYTHON=REAL).stdout.strip() == REAL
    wrong = _pick(TOOLS, PYTHON=str(tmp_path / "nothing"))
    assert wrong.returncode != 0 and "not a Python 3.11 interpreter" in wrong.stderr


def _repo_with_venv(tmp_path: Path, venv_python: Path) -> Path:
    """A copy of the two scripts with a ``.venv`` whose interpreter is ``venv_python``."""
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    for name in ("bootstrap.sh", "python_speed.py"):
        (repo / "tools" / name).write_text((REPO / "tools" / name).read_text())
    (repo / ".venv" / "bin").mkdir(parents=True)
    _venv_python(repo, venv_python)
    return repo


def _venv_python(repo: Path, base: Path) -> None:
    """``.venv/bin/python`` running ``base`` (a stub names itself as the base interpreter a venv would)."""
    python = repo / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/bash\nexec {base} "$@"\n')
    python.chmod(0o755)


def test_pick_python_says_when_the_existing_venv_is_on_a_slower_interpreter(tmp_path: Path) -> None:
    slow, fast = tmp_path / "a", tmp_path / "b"
    slow.mkdir()
    fast.mkdir()
    _stub(slow / "python3.11", "0.500")
    _stub(fast / "python3", "0.010")
    dirs = [slow, fast, *TOOLS]
    repo = _repo_with_venv(tmp_path, slow / "python3.11")
    env = {**os.environ, "PATH": os.pathsep.join(map(str, dirs))}
    done = subprocess.run(["bash", str(repo / "tools" / "bootstrap.sh"), "--pick-python"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert f"note: .venv runs on {slow / 'python3.11'} (0.500 s" in done.stderr
    assert f"{fast / 'python3'} (0.010 s) is faster" in done.stderr
    # on the fastest one already: nothing to say
    _venv_python(repo, fast / "python3")
    done = subprocess.run(["bash", str(repo / "tools" / "bootstrap.sh"), "--pick-python"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0 and "note:" not in done.stderr, done.stderr
