"""The ids of word pieces by their text: ``PieceCache``'s table, looked up once per piece of every text.

A *piece* is a run of spaces and the non-spaces after it, or the run of spaces that ends a text (what
``" *[^ ]+| +"`` finds). ``PieceTable(max_pieces, max_chars)`` answers

* ``lookup(text) -> (ids, [], pieces)`` when every piece of ``text`` is kept: ``ids`` its pieces' ids in order,
  ``pieces`` how many it has; else ``(partial, new, pieces)``, ``new`` the text of each piece not kept, in order,
  once each;
* ``partial.fill(fresh) -> (ids, [])``, the pieces not kept taken from ``fresh`` (a dict of piece -> ids), or
  ``(None, unknown)`` when some are in neither (dropped from the table since the lookup, by a ``keep`` here or in
  another thread);
* ``keep(fresh)``: keeps the ids of each piece of up to ``max_chars`` characters; at ``max_pieces`` the older half
  is dropped;
* ``len(table)``: pieces kept.

Made with ``packed=True``, every ``ids`` it answers is their uint32 bytes in native order instead of a list
(``token_ids.TokenIds("I", ids)`` reads them without an int object per id).

The C type ``native_word_pieces.PieceTable`` (``native_word_pieces.c``, built at install) finds the pieces in the
text's UTF-8 bytes and looks them up in its own hash table, with no Python object per piece; it is used when it
was built. Otherwise ``PieceTablePy`` here, two dicts, which is also its reference in the tests
(``tests/router/test_native_paths.py``). ``NATIVE`` says which one runs. A text holding a lone surrogate has no
UTF-8: the C table's ``lookup`` raises ``UnicodeEncodeError`` for it.
"""

from __future__ import annotations

import array
from itertools import chain, islice
from typing import Protocol

try:
    from sgl_moe.router.request import native_word_pieces
except ImportError:  # no C compiler at install: the Python functions below
    native_word_pieces = None

Ids = list[int]


class Partial(Protocol):
    def fill(self, fresh: dict[str, Ids]) -> tuple[Ids | None, list[str]]: ...


class PieceTable(Protocol):
    """What ``PieceCache`` calls (see the module)."""

    def __len__(self) -> int: ...

    def lookup(self, text: str) -> tuple[Ids | Partial, list[str], int]: ...

    def keep(self, fresh: dict[str, Ids]) -> None: ...


class PieceTablePy:
    """``PieceTable`` in Python: a first word, and a piece of two spaces or more, kept by its text in ``kept``; a
    piece of one space then a word (the word may be empty: one space ending the text) in ``words`` by its word
    (``str.split(" ")`` gives the words, at 5x the speed of the regex)."""

    def __init__(self, max_pieces: int, max_chars: int, *, packed: bool = False) -> None:
        self.max_pieces, self.max_chars, self.packed = max_pieces, max_chars, packed
        self.kept: dict[str, Ids] = {}
        self.words: dict[str, Ids] = {}

    def __len__(self) -> int:
        return len(self.kept) + len(self.words)

    def lookup(self, text: str) -> tuple[Ids | Partial, list[str], int]:
        found, missing, new, pieces = lookup_py(text, self.kept, self.words)
        if missing is None:
            return (_packed(found) if self.packed else found), [], pieces
        return _PartialPy(found, missing, new, self.packed), list(dict.fromkeys(new)), pieces

    def keep(self, fresh: dict[str, Ids]) -> None:
        for piece, ids in fresh.items():
            if not 0 < len(piece) <= self.max_chars:
                continue
            if len(self) >= self.max_pieces:
                self._drop_older_half()
            if piece[:1] == " " and " " not in piece[1:]:
                self.words[piece[1:]] = ids
            else:
                self.kept[piece] = ids

    def _drop_older_half(self) -> None:
        for table in (self.kept, self.words):
            for piece in list(islice(table, len(table) // 2)):
                table.pop(piece, None)  # another thread may have dropped it first


class _PartialPy:
    def __init__(self, found: list, missing: list[int], new: list[str], packed: bool) -> None:
        self.found, self.missing, self.new, self.packed = found, missing, new, packed

    def fill(self, fresh: dict[str, Ids]) -> tuple[Ids | None, list[str]]:
        unknown = [piece for piece in self.new if piece not in fresh]
        if unknown:
            return None, list(dict.fromkeys(unknown))
        found = list(self.found)
        for j, piece in zip(self.missing, self.new):
            found[j] = fresh[piece]
        ids = join_py(found)
        return (_packed(ids) if self.packed else ids), []


def lookup_py(text: str, kept: dict[str, Ids], words: dict[str, Ids]) -> tuple[list, list[int] | None,
                                                                               list[str] | None, int]:
    """``PieceTablePy``'s pieces of ``text``: ``(ids, None, None, pieces)`` when all are kept, else ``(found,
    missing, new, pieces)``: ``found[j]`` the j-th piece's ids or None, ``missing`` the j of each None, ``new`` the
    text of each missing piece. ``str.split(" ")`` gives the first word, then one part per space: a part is that
    space's word, "" for a space followed by another (``_space_runs`` joins those)."""
    parts = text.split(" ")
    first = parts[0]  # "" when the text starts with a space
    found = [kept.get(first)] if first else []
    at = len(found) - 1  # found[at + j] is parts[j]'s piece
    found += map(words.get, islice(parts, 1, None))
    runs = _space_runs(parts) if "  " in text else {}
    for j, piece in runs.items():
        found[at + j] = kept.get(piece) if piece else _NOTHING
    pieces = len(found) - sum(1 for piece in runs.values() if not piece)
    if None not in found:
        return list(chain.from_iterable(found)), None, None, pieces
    missing = _nones(found)
    new = [runs.get(j - at) or (parts[0] if j - at == 0 else " " + parts[j - at]) for j in missing]
    return found, missing, new, pieces


def join_py(found: list[Ids]) -> Ids:
    """The ids of ``found``'s lists, in order."""
    return list(chain.from_iterable(found))


def _packed(ids: Ids) -> bytes:
    """``ids`` as the packed table answers them: uint32 bytes in native order."""
    return array.array("I", ids).tobytes()


def new_table(max_pieces: int, max_chars: int, *, packed: bool = False) -> PieceTable:
    """The C table where it was built, else ``PieceTablePy``."""
    if native_word_pieces is not None:
        return native_word_pieces.PieceTable(max_pieces, max_chars, packed=packed)
    return PieceTablePy(max_pieces, max_chars, packed=packed)


NATIVE = native_word_pieces is not None


_NOTHING: Ids = []
"""The ids of an empty part inside a run of spaces: its space is in the run's piece."""


def _space_runs(parts: list[str]) -> dict[int, str]:
    """For ``parts = text.split(" ")``: the parts whose piece is not one space then the part. A run of ``m`` empty
    parts before a word is ``m + 1`` spaces then the word, one piece (at the word's index; the empty parts map to
    ""); ``m`` empty parts that end the text are a piece of ``m`` spaces (at the last one)."""
    runs: dict[int, str] = {}
    empty = _nones(parts, "")
    n, k = len(parts), 0
    while k < len(empty):
        a = empty[k]
        if a == 0:  # the text starts with a space: no first word, and the first space belongs to parts[1]'s piece
            k += 1
            continue
        b = a
        while k + 1 < len(empty) and empty[k + 1] == b + 1:
            k += 1
            b += 1
        k += 1
        m = b - a + 1
        if b == n - 1:  # spaces that end the text
            if m > 1:
                runs.update(dict.fromkeys(range(a, b), ""))
                runs[b] = " " * m
        else:
            runs.update(dict.fromkeys(range(a, b + 1), ""))
            runs[b + 1] = " " * (m + 1) + parts[b + 1]
    return runs


def _nones(found: list, what: object = None) -> list[int]:
    """Where ``found`` holds None, or ``what`` (searched at C speed: few of them in many)."""
    at: list[int] = []
    j = -1
    try:
        while True:
            j = found.index(what, j + 1)
            at.append(j)
    except ValueError:
        return at
