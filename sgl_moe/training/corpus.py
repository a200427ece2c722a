"""The training corpus: the running Python's standard library sources (code and docstrings).

Available offline on every machine that runs Python, so the shipped model can be rebuilt anywhere.
Files are split into train / held-out by a stable hash of their relative path, never by position.
``tokenize_docs`` turns documents into the one EOS-separated token stream the model is trained and measured on.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Test suites are mostly generated data and long literal tables; they would dominate the corpus.
_EXCLUDED_PARTS = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"})


@dataclass(frozen=True)
class CorpusSplit:
    train: list[str]
    """Documents (one source file each) used for training."""
    heldout: list[str]
    """Documents never seen in training; perplexity and routing statistics are measured on them."""

    @property
    def train_chars(self) -> int:
        return sum(len(d) for d in self.train)

    @property
    def heldout_chars(self) -> int:
        return sum(len(d) for d in self.heldout)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_heldout(rel_path: str, heldout_every: int) -> bool:
    digest = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(digest[:4], "little") % heldout_every == 0


def load_corpus(root: Path | None = None, heldout_every: int = 20, max_file_chars: int = 200_000) -> CorpusSplit:
    """Read every .py file under the stdlib root (sorted), skipping tests and huge generated files."""
    root = root or stdlib_root()
    train: list[str] = []
    heldout: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _EXCLUDED_PARTS.intersection(rel.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or len(text) > max_file_chars:
            continue
        (heldout if _is_heldout(rel.as_posix(), heldout_every) else train).append(text)
    return CorpusSplit(train=train, heldout=heldout)


def tokenize_docs(tokenizer, docs: list[str], eos_id: int) -> list[int]:
    """Concatenate documents into one token stream, each followed by EOS."""
    stream: list[int] = []
    for enc in tokenizer.encode_batch(docs, add_special_tokens=False):
        stream.extend(enc.ids)
        stream.append(eos_id)
    return stream
