"""The shipped model is reproducible from its recorded command (fixed seed).

Retraining all steps takes ~18 min on 2 cores, too long for CI; instead: the tokenizer retrains to
the same bytes, and the first 26 steps of training reproduce the losses logged by the shipped run.

The corpus is the stdlib of the Python the shipped run used (``MODEL_CARD.md``: 3.11.7); another patch version's
stdlib (Debian's 3.11.2, which ``tools/bootstrap.sh`` may build ``.venv`` on) is another corpus. The test reads that
version's stdlib from whichever interpreter on this machine has it.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.training.corpus import stdlib_root
from sgl_moe.training.train import TrainConfig, train


def _shipped_python() -> str:
    card = (DEFAULT_MODEL_DIR / "MODEL_CARD.md").read_text()
    return re.search(r"Measured with Python (\d+\.\d+\.\d+)", card)[1]


def _interpreters() -> list[Path]:
    """Every python3.11 / python3 on PATH, and pyenv's versions."""
    found = [Path(d) / name for d in os.environ.get("PATH", "").split(os.pathsep) for name in ("python3.11", "python3")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found += sorted(pyenv.glob("*/bin/python3"))
    return [p for p in found if p.is_file() and os.access(p, os.X_OK)]


def _stdlib_of(version: str) -> Path | None:
    """The stdlib directory of a Python ``version`` on this machine (this interpreter's first), or None."""
    if ".".join(map(str, sys.version_info[:3])) == version:
        return stdlib_root()
    for exe in _interpreters():
        try:
            out = subprocess.run([str(exe), "-c", "import sys, sysconfig; print('.'.join(map(str, "
                                  "sys.version_info[:3]))); print(sysconfig.get_paths()['stdlib'])"],
                                 capture_output=True, text=True, timeout=30).stdout.split("\n")
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(out) >= 2 and out[0] == version and Path(out[1]).is_dir():
            return Path(out[1])
    return None


def test_tokenizer_and_first_steps_reproduce_the_shipped_run(tmp_path):
    record = json.loads((DEFAULT_MODEL_DIR / "training.json").read_text())
    cfg = TrainConfig(**record["train_config"])
    version = _shipped_python()
    root = _stdlib_of(version)
    if root is None:
        pytest.skip(f"the shipped model's corpus is Python {version}'s stdlib, and no Python {version} is on this "
                    "machine")
    log = train(tmp_path, cfg, stop_after=25, corpus_root=root)
    assert (tmp_path / "tokenizer.json").read_bytes() == (DEFAULT_MODEL_DIR / "tokenizer.json").read_bytes()
    shipped = {r["step"]: r for r in record["log"]}
    assert [r["step"] for r in log] == [0, 25]
    for rec in log:
        # Same data order and initialisation; float32 on 2 threads is deterministic, the margin only
        # absorbs a different CPU's vector width.
        assert rec["lm_loss"] == pytest.approx(shipped[rec["step"]]["lm_loss"], abs=2e-3)
        assert rec["aux_loss"] == pytest.approx(shipped[rec["step"]]["aux_loss"], abs=2e-3)


def test_cli_reads_the_corpus_from_corpus_root(tmp_path, monkeypatch, capsys):
    from sgl_moe.training import train as train_module

    called = {}
    monkeypatch.setattr(train_module, "train", lambda out, cfg, corpus_root=None: called.update(
        out=out, steps=cfg.steps, corpus_root=corpus_root))
    monkeypatch.setattr("sgl_moe.training.model_card.write_model_card", lambda out: None)
    root = tmp_path / "lib"
    root.mkdir()
    (root / "os.py").write_text("x = 1\n")
    train_module.main(["--out", str(tmp_path / "m"), "--steps", "3", "--corpus-root", str(root)])
    assert called == {"out": tmp_path / "m", "steps": 3, "corpus_root": root}
    assert f"corpus: the stdlib at {root}" in capsys.readouterr().out


def test_cli_refuses_a_corpus_root_without_python_files(tmp_path, capsys):
    from sgl_moe.training import train as train_module

    with pytest.raises(SystemExit) as exc:
        train_module.main(["--out", str(tmp_path / "m"), "--corpus-root", str(tmp_path / "missing")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--corpus-root {tmp_path / 'missing'}: not a Python stdlib directory (no .py files in it)" in err
