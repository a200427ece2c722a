"""Segments: named runs of prompt text whose token ids under the shipped tokenizer are known up front.

A workload request is a list of segments, so prefix sharing, prompt lengths and the oracle cache can be
computed from keys alone and text is rendered only when a task is sent. Two kinds share one type:

* **generated**: the key is an identifier (``"s0/quality/doc/17"``); the text is ``" w1 w2 ... wN"``
  with N = ``tokens``, the words drawn from the tokenizer's one-token words (vocabulary entries ``▁word``
  of lowercase ASCII letters) by a RNG seeded with a stable hash of the key (blake2b, never ``hash()``).
  Different keys give different text with probability ~1 - 1/907 per word (the first words differ
  unless the streams collide). Sibling keys ``base#j`` (a request's candidates) are different for sure:
  their first word is ``WORDS[(hash(base) + j) % len(WORDS)]``, distinct for distinct ``j``, so contract A
  never sees duplicate choices.
* **literal**: the key starts with ``"\\n"`` and *is* the text (template pieces such as ``"\\nAnswer:"``);
  its token count is measured with the tokenizer.

Why a concatenation of segments tokenizes to the concatenation of their ids: ``tokenizer.json`` is a
BPE with no pre-tokenizer and no post-processor (``add_special_tokens=True`` adds nothing), none of its
merges has a right side starting with ``▁`` unless the left side is all ``▁``, and no merge involves
``"\\n"`` (a byte-fallback token). Every segment starts with ``" "`` or ``"\\n"`` and never ends with a
space, so BPE never merges across a segment boundary. ``vocabulary()`` checks the merge property when
it loads the tokenizer; tests/workloads check the whole property on generated prompts.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from sgl_moe import DEFAULT_MODEL_DIR

TOKENIZER_PATH: Path = DEFAULT_MODEL_DIR / "tokenizer.json"
"""The shipped model's tokenizer: the words and the literal token counts are measured against it."""

SPACE = "\u2581"  # sentencepiece's "▁": the tokenizer's normalizer turns " " into it


@dataclass(frozen=True)
class Segment:
    """A run of prompt text identified by its key (equal keys => identical text and token ids)."""

    key: str
    """Content identity: a generated identifier, or for literals the literal text (starts with "\\n")."""
    tokens: int
    """Exact length in tokens under the shipped tokenizer."""

    @property
    def is_literal(self) -> bool:
        return self.key.startswith("\n")


_object_new = object.__new__


def new_segment(key: str, tokens: int) -> Segment:
    """``Segment(key, tokens)``, built without the frozen ``__init__``'s per-field ``object.__setattr__``.

    Equal to the constructor's result in every way; about twice as fast, which matters for the millions
    of segments of a million-request run.
    """
    seg = _object_new(Segment)
    fields = seg.__dict__
    fields["key"] = key
    fields["tokens"] = tokens
    return seg


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer and the one-token words segment text is made of."""

    tokenizer: Tokenizer
    words: tuple[str, ...]
    """Words without their leading space; ``" " + word`` is exactly one token."""
    word_ids: tuple[int, ...]
    """Token id of ``" " + words[i]``."""


def stable_hash(key: str) -> int:
    """A 64-bit hash of ``key`` that is the same in every process (``hash()`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def _check_merges(tokenizer_json: dict) -> None:
    """Refuse a tokenizer whose BPE could merge across a segment boundary (see the module docstring)."""
    model = tokenizer_json["model"]
    if model.get("type") != "BPE" or tokenizer_json.get("pre_tokenizer") is not None \
            or tokenizer_json.get("post_processor") is not None:
        raise ValueError(f"{TOKENIZER_PATH}: expected a plain BPE without pre-tokenizer or post-processor")
    for merge in model["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if "\n" in left + right or (right.startswith(SPACE) and left.strip(SPACE)):
            raise ValueError(f"{TOKENIZER_PATH}: merge {left!r} + {right!r} crosses segment boundaries")


@lru_cache(maxsize=1)
def vocabulary() -> Vocabulary:
    """Load the shipped tokenizer (``tokenizers`` only, never transformers) and pick the words."""
    _check_merges(json.loads(TOKENIZER_PATH.read_text(encoding="utf-8")))
    tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
    vocab = tokenizer.get_vocab()
    candidates = sorted(piece[1:] for piece in vocab if piece.startswith(SPACE)
                        and re.fullmatch("[a-z]+", piece[1:]))
    # A vocabulary entry is not always what BPE produces for its own text: keep only words that are.
    encoded = tokenizer.encode_batch([" " + w for w in candidates], add_special_tokens=True)
    words = [w for w, e in zip(candidates, encoded) if e.ids == [vocab[SPACE + w]]]
    if len(words) < 100:
        raise ValueError(f"{TOKENIZER_PATH}: only {len(words)} one-token words")
    return Vocabulary(tokenizer, tuple(words), tuple(vocab[SPACE + w] for w in words))


@lru_cache(maxsize=4096)
def literal(text: str) -> Segment:
    """A template piece as a segment whose key is its text; the token count is measured."""
    if not text.startswith("\n") or text.endswith(" "):
        raise ValueError(f"a literal segment must start with a newline and not end with a space: {text!r}")
    return Segment(text, len(vocabulary().tokenizer.encode(text, add_special_tokens=True).ids))


@lru_cache(maxsize=256)
def _word_indices(key: str, tokens: int) -> tuple[int, ...]:
    words = vocabulary().words
    base, sep, sibling = key.rpartition("#")
    rng = random.Random(stable_hash(key))
    picks = rng.choices(range(len(words)), k=tokens)
    if sep and sibling.isdigit() and tokens:
        picks[0] = (stable_hash(base) + int(sibling)) % len(words)
    return tuple(picks)


@lru_cache(maxsize=1024)
def segment_text(seg: Segment) -> str:
    """The deterministic text of ``seg``: exactly ``seg.tokens`` tokens under the shipped tokenizer."""
    if seg.is_literal:
        return seg.key
    words = vocabulary().words
    return "".join([" " + words[i] for i in _word_indices(seg.key, seg.tokens)])


def segment_token_ids(seg: Segment) -> list[int]:
    """The token ids of ``segment_text(seg)``, computed without tokenizing it (except literals)."""
    vocab = vocabulary()
    if seg.is_literal:
        return list(_literal_ids(seg.key))
    return [vocab.word_ids[i] for i in _word_indices(seg.key, seg.tokens)]


@lru_cache(maxsize=4096)
def _literal_ids(text: str) -> tuple[int, ...]:
    return tuple(vocabulary().tokenizer.encode(text, add_special_tokens=True).ids)
