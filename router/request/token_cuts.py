"""Where a text may be cut so that encoding the two parts apart gives the ids of encoding it whole.

``encode(a + b) == encode(a) + encode(b)`` (no special tokens added) holds at a cut ``c`` of ``text`` only when
nothing the tokenizer does looks across ``c``: the normalizer, the added-token split, the pre-tokenizer and the
model. ``CutRule.of`` reads a fast tokenizer's pipeline (its ``tokenizer.json``) and answers with a rule for the
pipelines it can reason about, or None (the text is then always encoded whole). Two families:

- **Whole-text BPE** (no pre-tokenizer, or ``Metaspace`` without splitting: sentencepiece models as transformers
  converts them). BPE merges adjacent symbols into vocabulary tokens, so a merge across ``c`` would make a token
  holding the characters ``text[c-1]`` and ``text[c]`` side by side. Where no vocabulary token holds that pair,
  no merge crosses ``c``, every merge on one side happens in the same order without the other side, and the ids
  are those of the two parts. ``Metaspace`` prepends its marker to a text that does not start with a space, so
  there ``text[c]`` must be a space.
- **Regex pieces, then byte-level BPE** (GPT-2, Qwen2, Llama 3: ``ByteLevel`` with its own regex, or ``Split``
  with a known pattern then ``ByteLevel``). BPE runs within pieces, so the ids split at ``c`` when the pieces
  do. For the known patterns a newline followed by an ASCII letter or digit always ends a piece, and the pieces
  before are the same without what follows when the character before that newline is not whitespace (GPT-2's
  ``\\s+(?!\\S)`` takes ``"  \\n"`` whole at the end of a text and as ``"  "``, ``"\\n"`` before a letter).

In both families no added token (``<|im_start|>``, ``\\t``, ...) may cover ``text[c-1]`` or ``text[c]``, since
added tokens are split out before anything else; tokenizers with added tokens that strip spaces around them or
match single words only are not cut. Unicode normalizers (NFC, NFKC, NFD, NFKD) compose or reorder a character
with its neighbours; with one, both characters at the cut must be ASCII, which none of them changes or composes.

The rule is the argument above, checked by property tests (``tests/router/test_prefix_memo.py``) over every
fixture tokenizer with random and adversarial cuts; in service ``PrefixMemo`` also encodes a sample of texts
whole and turns itself off on any difference.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

try:
    from sgl_moe.router.request.native_cut_scan import CutScan
except ImportError:  # no C compiler at install
    CutScan = None
NATIVE = CutScan is not None
"""Whether ``CutRule.next_cut`` scans in C (``native_cut_scan``) or runs its Python reference."""

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""The regex ``ByteLevel(use_regex=True)`` splits with (tokenizers' own)."""

_CONTRACTIONS_AND_WORDS = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"""
_PUNCTUATION_AND_SPACE = r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
NEWLINE_RUN_PATTERNS = frozenset({
    _CONTRACTIONS_AND_WORDS + r"\p{N}" + _PUNCTUATION_AND_SPACE,  # Qwen2 / Qwen2.5 / Qwen3
    _CONTRACTIONS_AND_WORDS + r"\p{N}{1,3}" + _PUNCTUATION_AND_SPACE,  # Llama 3 (cl100k-style digit groups)
})
"""Patterns whose ``\\s*[\\r\\n]+`` comes before ``\\s+(?!\\S)``: a run of whitespace ending in newlines is one
piece whatever follows it, unless a non-space follows on the same line."""
KNOWN_SPLIT_PATTERNS = NEWLINE_RUN_PATTERNS | {GPT2_PATTERN}
"""``Split`` patterns for which a newline followed by a printable ASCII character always ends a piece: no
alternative matches a newline and then a non-space."""

UNICODE_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})
CHARWISE_NORMALIZERS = frozenset({"Lowercase"})
"""Normalizers that map each character on its own (ASCII ones at least): cuts are unaffected."""


@dataclass(frozen=True)
class CutRule:
    """Which cuts of a text keep its ids (see the module docstring); built by ``of``."""

    family: str
    """``whole-text-bpe`` or ``regex-pieces``."""
    pair_chars: frozenset[str] | None
    """Whole-text BPE: every two adjacent characters of any vocabulary token (normalized form), as 2-char strings."""
    char_map: dict[str, str]
    """Whole-text BPE: characters the normalizer or ``Metaspace`` replaces (``" "`` -> ``"▁"``)."""
    space_before_cut: bool
    """``Metaspace`` prepends its marker: ``text[c]`` must be a space."""
    ascii_at_cut: bool
    """A Unicode normalizer: both characters at the cut must be ASCII."""
    added_by_char: frozenset[str]
    """Characters the added tokens hold (a cut between two others cannot be covered by one)."""
    added_pattern: re.Pattern[str]
    """Finds every added token's occurrence, overlapping ones too."""
    added_max_len: int
    lowercase_added: bool
    """Added tokens match the lowercased text (a ``Lowercase`` normalizer and ``normalized`` added tokens)."""
    space_before_newline: bool = True
    """Regex pieces: the character before the newline may be whitespace (``NEWLINE_RUN_PATTERNS``)."""
    alphabet: frozenset[str] | None = None
    """Whole-text BPE without byte fallback: the characters the vocabulary holds (both at a cut must be known)."""
    added_contents: tuple[str, ...] = ()
    """The added tokens' contents (lowercased where ``lowercase_added``), longest first."""

    @classmethod
    def of(cls, backend: Any) -> tuple[CutRule | None, str]:
        """The rule for a ``tokenizers.Tokenizer``, or None and why its texts are always encoded whole."""
        spec = json.loads(backend.to_str())
        model = spec.get("model") or {}
        if model.get("type") != "BPE" or model.get("dropout"):
            return None, f"model {model.get('type')} (dropout {model.get('dropout')}): only plain BPE is cut"
        whole_word_marks = model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")
        normalizers = _flatten(spec.get("normalizer"), "normalizers")
        char_map: dict[str, str] = {}
        ascii_at_cut = lowercase = False
        for n in normalizers:
            kind = n.get("type")
            if kind in UNICODE_NORMALIZERS:
                ascii_at_cut = True
            elif kind in CHARWISE_NORMALIZERS:
                lowercase = True
            elif kind == "Replace" and _single_char_replace(n):
                char_map[n["pattern"]["String"]] = n["content"]
            else:
                return None, f"normalizer {kind}"
        added = spec.get("added_tokens") or []
        if any(a.get("lstrip") or a.get("rstrip") or a.get("single_word") for a in added):
            return None, "added tokens that strip spaces or match single words"
        contents = sorted({a["content"].lower() if lowercase and a.get("normalized") else a["content"]
                           for a in added if a["content"]}, key=len, reverse=True)
        alternatives = "|".join(map(re.escape, contents)) or "(?!)"
        common = dict(ascii_at_cut=ascii_at_cut, added_by_char=frozenset("".join(contents)),
                      added_contents=tuple(contents),
                      added_pattern=re.compile(f"(?=({alternatives}))"),
                      added_max_len=max(map(len, contents), default=0),
                      lowercase_added=lowercase and any(a.get("normalized") for a in added))
        pre = _flatten(spec.get("pre_tokenizer"), "pretokenizers")
        family = _regex_family(pre)
        if family is not None:
            if family:
                return None, family
            pattern = (pre[0].get("pattern") or {}).get("Regex") if len(pre) == 2 else GPT2_PATTERN
            return cls("regex-pieces", None, {}, False, space_before_newline=pattern in NEWLINE_RUN_PATTERNS,
                       **common), ""
        space_before_cut = False
        if len(pre) == 1 and pre[0].get("type") == "Metaspace" and not pre[0].get("split", True):
            replacement = pre[0].get("replacement", "\u2581")
            char_map[" "] = replacement
            space_before_cut = pre[0].get("prepend_scheme", "always") != "never"
        elif pre:
            return None, f"pre-tokenizer {'+'.join(p.get('type', '?') for p in pre)}"
        if lowercase:
            return None, "a Lowercase normalizer over whole-text BPE"
        if whole_word_marks or model.get("ignore_merges"):
            return None, "BPE over the whole text with word marks or ignore_merges (the text's ends matter)"
        vocab = model.get("vocab", {})
        pairs = {token[i:i + 2] for token in vocab for i in range(len(token) - 1)}
        # Without byte fallback, unknown characters become <unk> (fused when fuse_unk): cut only between known ones.
        alphabet = None if model.get("byte_fallback") else frozenset(ch for token in vocab for ch in token)
        return cls("whole-text-bpe", frozenset(pairs), char_map, space_before_cut, alphabet=alphabet, **common), ""

    @property
    def reach(self) -> int:
        """``allows(text, c)`` reads ``text`` only within ``[c - reach, c + reach)``: two texts that agree there get
        the same answer at ``c``."""
        return max(2, self.added_max_len)

    def allows(self, text: str, c: int) -> bool:
        """Whether ``encode(text) == encode(text[:c]) + encode(text[c:])``, by the rule (``0 < c < len(text)``):
        ``native_cut_scan`` answers where it was built, else (and for the places it leaves to Python) ``allows_py``."""
        scan = self._scan
        if scan is not None:
            p = scan.next(text, c, c + 1)
            if p is None or p > 0:
                return p is not None
        return self.allows_py(text, c)

    def allows_py(self, text: str, c: int) -> bool:
        """``allows`` in Python: the reference of ``native_cut_scan``."""
        before, after = text[c - 1], text[c]
        if self.ascii_at_cut and not (before.isascii() and after.isascii()):
            return False
        if self.family == "regex-pieces":
            if before != "\n" or not after.isascii() or after.isspace():
                return False
            if not self.space_before_newline and c >= 2 and text[c - 2].isspace():
                return False
        else:
            if self.space_before_cut and after != " ":
                return False
            before, after = self.char_map.get(before, before), self.char_map.get(after, after)
            if before + after in self.pair_chars:
                return False
            if self.alphabet is not None and (before not in self.alphabet or after not in self.alphabet):
                return False
        return not self._added_token_covers(text, c)

    def next_cut(self, text: str, c: int, stop: int) -> int | None:
        """The first ``p`` in ``[c, stop)`` with ``allows(text, p)``, or None (``1 <= c``, ``stop <= len(text)``)."""
        scan = self._scan
        if scan is None:
            return self.next_cut_py(text, c, stop)
        while True:
            p = scan.next(text, c, stop)
            if p is None or p > 0:
                return p
            p = -p  # allowed but for the added tokens, which may hold a character at the cut
            if not self._added_token_covers(text, p):
                return p
            c = p + 1

    def next_cut_py(self, text: str, c: int, stop: int) -> int | None:
        """``next_cut`` in Python: the reference of ``native_cut_scan`` (and where it was not built)."""
        while c < stop:
            if self.family == "regex-pieces":  # only just after a newline
                c = text.find("\n", c - 1, stop - 1) + 1
                if c == 0:
                    return None
            elif self.space_before_cut:  # only just before a space
                c = text.find(" ", c, stop)
                if c == -1:
                    return None
            if self.allows_py(text, c):
                return c
            c += 1
        return None

    @functools.cached_property
    def _scan(self) -> Any:
        """The rule's data in a ``native_cut_scan.CutScan`` (None: not built, a character map it cannot hold, or added
        tokens' characters that are not those of ``added_contents``, which it compares)."""
        if CutScan is None or any(len(k) != 1 or len(v) != 1 for k, v in self.char_map.items()):
            return None
        if frozenset("".join(self.added_contents)) != self.added_by_char:
            return None
        return CutScan(self.family == "regex-pieces", self.space_before_cut, self.ascii_at_cut,
                       self.space_before_newline, self.char_map, list(self.pair_chars or ()),
                       None if self.alphabet is None else list(self.alphabet), list(self.added_by_char),
                       self.lowercase_added, list(self.added_contents))

    def _added_token_covers(self, text: str, c: int) -> bool:
        """An added token's occurrence holds ``text[c-1]`` or ``text[c]``."""
        before, after = text[c - 1], text[c]
        if self.lowercase_added:
            before, after = before.lower(), after.lower()
        if before not in self.added_by_char and after not in self.added_by_char:
            return False
        start = max(0, c - self.added_max_len)
        window = text[start:c + self.added_max_len]
        if self.lowercase_added:
            window = window.lower()
        # every occurrence, overlapping ones too (a lookahead matches at each position): [s, e) holds c-1 or c
        return any(start + m.start() <= c <= start + m.end(1) for m in self.added_pattern.finditer(window))


def _flatten(node: dict | None, key: str) -> list[dict]:
    if not node:
        return []
    if node.get("type") == "Sequence":
        return [leaf for child in node.get(key, []) for leaf in _flatten(child, key)]
    return [node]


def _single_char_replace(n: dict) -> bool:
    pattern, content = (n.get("pattern") or {}).get("String"), n.get("content")
    return isinstance(pattern, str) and len(pattern) == 1 and isinstance(content, str) and len(content) == 1


def _regex_family(pre: list[dict]) -> str | None:
    """None: not a regex-pieces pipeline; "": one this module can cut; otherwise why it cannot."""
    kinds = [p.get("type") for p in pre]
    if kinds == ["ByteLevel"]:
        p = pre[0]
        if not p.get("use_regex", True):
            return "ByteLevel without its regex"
        return "ByteLevel with a prefix space" if p.get("add_prefix_space", True) else ""
    if kinds == ["Split", "ByteLevel"]:
        split, byte_level = pre
        pattern = (split.get("pattern") or {}).get("Regex")
        if pattern not in KNOWN_SPLIT_PATTERNS or split.get("behavior") != "Isolated" or split.get("invert"):
            return "Split with a pattern this module does not know"
        if byte_level.get("add_prefix_space", True) or byte_level.get("use_regex", True):
            return "ByteLevel with a prefix space or its own regex after Split"
        return ""
    return None
