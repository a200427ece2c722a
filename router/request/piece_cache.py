"""Ids of the words of texts, each word encoded once, for tokenizers that run BPE over the whole text.

Sentencepiece models as transformers converts them (Llama 2, Mistral, Mixtral, the shipped model) have no
pre-tokenizer: BPE sees the whole text, and the tokenizers library pays about a microsecond per token on the 2-core
VM however often it has seen the words. Split the text into *pieces* instead, each a run of spaces and the
non-spaces after it (``" *[^ ]+| +"``): between two pieces the text holds a non-space then a space, a place
``CutRule`` allows a cut (``token_cuts``: encoding the two sides apart gives the ids of encoding them together)
unless

- a vocabulary token holds that pair (BPE may merge across it): the character before the space is one of
  ``joiners``;
- an added token's occurrence covers it: the text holds an added token's content;
- a Unicode normalizer runs and either character is not ASCII;
- the vocabulary lacks either character (no byte fallback: ``<unk>`` may fuse).

A text with none of those is the concatenation of its pieces' ids (the cut argument, one cut at a time). Each
check runs over the whole text at C speed, never cut by cut; a text failing one is encoded whole. A
``word_pieces.PieceTable`` finds the pieces and keeps their ids: pieces up to ``MAX_PIECE_CHARS`` characters,
``MAX_PIECES`` of them, the older half dropped when full. New pieces of a batch are encoded in one call.
``PrefixMemo`` encodes its segments through this, so its sampled whole-encode check covers it in service. The ids
come out packed (``token_ids.TokenIds``): the table writes them into one buffer, with no int object per id.

New pieces go to ``encode_new`` when the tokenizer gives one (``router_tokenizer.piece_encoder``: the library's
normalizer, pre-tokenizer and model called directly, about 4 times cheaper for a request's one or two new pieces
than a batch encode), else to ``encode_plain``; texts that fail a check always go to ``encode_plain``.

A long text is checked and cut in runs of about ``CHUNK_CHARS`` (a run ends where a piece does, so its pieces are
the text's own): one C call over a whole 4 MB text holds the GIL for tens of milliseconds, and the router parses
large bodies in a thread so that its event loop keeps answering meanwhile, which it can only do between such calls.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from sgl_moe.router.request.token_cuts import CutRule
from sgl_moe.router.request.token_ids import TokenIds
from sgl_moe.router.request.word_pieces import Partial, new_table

MAX_PIECES = 200_000
"""Pieces kept (about 100 bytes each in the C table: two slots of 32 bytes, the text and the ids)."""
MAX_PIECE_CHARS = 64
"""Longer pieces (a URL, base64) are encoded each time, not kept."""
CHUNK_CHARS = 16_384
"""Characters one C call over a text covers at most (checks and cuts of longer texts go run by run)."""

EncodeBatch = Callable[[list[str]], list[list[int]]]


class PieceCache:
    """``encode_plain`` (ids without special tokens) piece by piece; see the module. Built by ``of``."""

    def __init__(self, encode_plain: EncodeBatch, joiners: str, added: list[str], ascii_only: bool,
                 known: frozenset[str] | None, encode_new: EncodeBatch | None = None) -> None:
        self._encode_plain = encode_plain
        self._encode_new = encode_new or encode_plain
        """Ids of pieces (texts holding no added token's content), as ``encode_plain`` gives them."""
        self._joined = re.compile(f"[{re.escape(joiners)}] ") if joiners else None
        """Finds a space after a character BPE may merge it with."""
        self._added = by_first_char(added)
        """The added tokens' contents by their first character (``holds_any``)."""
        self._reach = max(2, max(map(len, added), default=0))
        """Characters of the longest pattern ``cuttable`` looks for (a joiner and its space, an added token)."""
        self._ascii_only = ascii_only
        self._known = known
        """Characters the vocabulary holds (None: byte fallback, every character is known)."""
        self._table = new_table(MAX_PIECES, MAX_PIECE_CHARS, packed=True)
        """The ids of pieces encoded before. Its calls hold the GIL throughout: threads parsing at once share it
        without a lock."""
        self.hits = 0
        """Pieces whose ids were kept."""
        self.misses = 0
        """Pieces encoded."""
        self.whole = 0
        """Texts encoded whole (a check failed)."""

    @classmethod
    def of(cls, rule: CutRule, encode_plain: EncodeBatch, encode_new: EncodeBatch | None = None) -> PieceCache | None:
        """The cache for ``rule``'s tokenizer, or None when its texts cannot be cut at spaces (regex pieces).
        ``encode_new``: a cheaper ``encode_plain`` for pieces, if the tokenizer has one."""
        if rule.family != "whole-text-bpe" or rule.lowercase_added:
            return None
        space = rule.char_map.get(" ", " ")
        if rule.alphabet is not None and space not in rule.alphabet:
            return None
        originals: dict[str, set[str]] = {}
        for src, dst in rule.char_map.items():
            originals.setdefault(dst, set()).add(src)
        joiners = {orig for pair in rule.pair_chars if pair[1] == space
                   for orig in ({pair[0]} | originals.get(pair[0], set())) if orig != " "}
        known = None
        if rule.alphabet is not None:
            known = frozenset({ch for ch in rule.alphabet if ch not in rule.char_map}
                              | {src for src, dst in rule.char_map.items() if dst in rule.alphabet})
        return cls(encode_plain, "".join(sorted(joiners)), list(rule.added_contents), rule.ascii_at_cut, known,
                   encode_new)

    def cuttable(self, text: str) -> bool:
        """Every place between two pieces of ``text`` is a cut ``CutRule`` allows."""
        if len(text) <= CHUNK_CHARS:
            return self._cuttable(text)
        over = self._reach - 1  # a pattern starting in one run ends within ``over`` characters of its end
        for a in range(0, len(text), CHUNK_CHARS):
            if not self._cuttable(text[a:a + CHUNK_CHARS + over]):
                return False
            _hand_over_the_gil()
        return True

    def _cuttable(self, text: str) -> bool:
        if self._ascii_only and not text.isascii():
            return False
        if self._known is not None and not self._known.issuperset(text):
            return False
        if self._joined is not None and self._joined.search(text):
            return False
        return not holds_any(text, self._added)

    def encode_batch(self, texts: list[str]) -> list[TokenIds]:
        """The ids of each text without special tokens, as ``encode_plain`` gives them, packed (``TokenIds``)."""
        cut = [self.cuttable(t) for t in texts]
        long = {i for i, (ok, t) in enumerate(zip(cut, texts)) if ok and len(t) > CHUNK_CHARS}
        if not long:
            return self._encode(texts, cut)
        short = [i for i in range(len(texts)) if i not in long]
        out: list[TokenIds] = [TokenIds("I")] * len(texts)
        for i, ids in zip(short, self._encode([texts[i] for i in short], [cut[i] for i in short])):
            out[i] = ids
        for i in long:  # run after run: a run's new pieces are kept before the next run looks them up
            ids = TokenIds("I")
            for run in _runs(texts[i]):
                ids.extend(self._encode([run], [True])[0])
                _hand_over_the_gil()
            out[i] = ids
        return out

    def _encode(self, texts: list[str], cut: list[bool]) -> list[TokenIds]:
        """``encode_batch`` of texts whose ``cuttable`` is known."""
        table = self._table
        out: list = []
        partial: list[int] = []
        """Texts with pieces not kept (``out`` holds their partial lookups)."""
        new: dict[str, None] = {}
        whole: list[int] = []
        for i, text in enumerate(texts):
            found = None
            if cut[i]:
                try:
                    found, unknown, pieces = table.lookup(text)
                except UnicodeEncodeError:  # a lone surrogate: the C table cannot read the text
                    cut[i] = False
                else:
                    self.hits += pieces - len(unknown)
                    if unknown:
                        partial.append(i)
                        new.update(dict.fromkeys(unknown))
                    else:
                        found = TokenIds("I", found)
            out.append(found)
            if not cut[i]:
                whole.append(i)
        if not (new or whole):
            return out
        fresh = dict(zip(new, self._encode_new(list(new)))) if new else {}
        self.misses += len(new)
        self.whole += len(whole)
        if whole:
            for i, ids in zip(whole, self._encode_plain([texts[i] for i in whole])):
                out[i] = TokenIds("I", ids)
        for i in partial:
            out[i] = self._fill(out[i], fresh)
        table.keep(fresh)
        return out

    def _fill(self, found: Partial, fresh: dict[str, list[int]]) -> TokenIds:
        """The ids of a text looked up with pieces not kept, those taken from ``fresh``. A piece the lookup found
        kept may have been dropped since (another thread's ``keep`` made room): it is encoded again."""
        ids, unknown = found.fill(fresh)
        while ids is None:
            fresh.update(zip(unknown, self._encode_new(unknown)))
            self.misses += len(unknown)
            self.hits -= len(unknown)
            ids, unknown = found.fill(fresh)
        return TokenIds("I", ids)


def by_first_char(contents: list[str]) -> dict[str, tuple[str, ...]]:
    """``contents`` (non-empty strings) grouped by their first character, for ``holds_any``."""
    groups: dict[str, list[str]] = {}
    for content in contents:
        groups.setdefault(content[0], []).append(content)
    return {first: tuple(group) for first, group in groups.items()}


FIRST_CHAR_TRIES = 8
"""Occurrences of a first character ``holds_any`` tries one by one before it searches for each content whole."""


def holds_any(text: str, by_first: dict[str, tuple[str, ...]]) -> bool:
    """Whether ``text`` holds one of the strings of ``by_first`` (``by_first_char``): ``any(c in text ...)``.

    Each of ``str.__contains__``'s searches for a short string costs about 0.6 ns a character (31 us for the shipped
    tokenizer's five added tokens over an 11,500-character text on the 2-core VM), where finding one character is
    memchr's ~0.03 ns: so find each group's first character, and try the group's strings where it stands. A text
    where it stands often (markup full of ``<``) is searched for each string whole past ``FIRST_CHAR_TRIES``
    occurrences, as before."""
    for first, contents in by_first.items():
        at = text.find(first)
        tries = 0
        while at != -1:
            if tries == FIRST_CHAR_TRIES:
                if any(text.find(c, at) != -1 for c in contents):
                    return True
                break
            for c in contents:
                if text.startswith(c, at):
                    return True
            tries += 1
            at = text.find(first, at + 1)
    return False


_SPACES = re.compile(" +")


def _hand_over_the_gil() -> None:
    """Let a thread waiting for the GIL (the event loop, while a large body is parsed in a thread) run now. The
    interpreter hands the GIL over every 5 ms between bytecodes; this module compiled (``setup.py``) runs none, so a
    4 MB text's runs would hold it for a second (``/health`` answered in 0.92 s, tests/live/test_hardening_live.py)."""
    time.sleep(0)


def _runs(text: str) -> list[str]:
    """``text`` cut into runs of at least ``CHUNK_CHARS`` characters (the last may be shorter), each ending where a
    piece does (before a space that follows a non-space): the pieces of the runs, in order, are those of ``text``."""
    runs: list[str] = []
    start = 0
    while len(text) - start > CHUNK_CHARS:
        k = text.find(" ", start + CHUNK_CHARS)
        if k != -1 and text[k - 1] == " ":  # inside a run of spaces: the next piece ends after it
            k = text.find(" ", _SPACES.match(text, k).end())
        if k == -1:
            break
        runs.append(text[start:k])
        start = k
    runs.append(text[start:])
    return runs
