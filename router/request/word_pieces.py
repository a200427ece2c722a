"""A text's pieces looked up in ``PieceCache``'s two tables: the loop that runs once per piece of every text.

A *piece* is a run of spaces and the non-spaces after it, or the run of spaces that ends a text (what
``" *[^ ]+| +"`` finds). A piece of one space then a word (the word may be empty: one space ending the text) is
kept in ``words`` by its word; every other piece (a text's first word, a piece of two spaces or more) in ``kept``
by its text (``PieceCache._keep`` stores them so).

``lookup(text, kept, words)`` answers ``(ids, None, None, pieces)`` when every piece's ids are kept: ``ids`` the
text's ids, ``pieces`` how many pieces it has. Otherwise ``(found, missing, new, pieces)``: ``found`` holds each
piece's ids or None, ``missing`` the indexes of the Nones, ``new`` the text of each missing piece; the caller
encodes the new pieces, puts their ids in ``found`` at ``missing`` and calls ``join(found)`` for the text's ids.
``found``'s layout is the implementation's own (the Python one holds an empty list for each space of a run).

The C extension ``native_word_pieces`` (``native_word_pieces.c``, built at install: 64 against 160 µs for a text of
851 pieces in small tables) is used when it was built; otherwise the Python functions here, which are also its
reference in the tests (``tests/router/test_native_paths.py``). ``NATIVE`` says which one runs.
"""

from __future__ import annotations

from itertools import chain, islice

try:
    from sgl_moe.router.request import native_word_pieces
except ImportError:  # no C compiler at install: the Python functions below
    native_word_pieces = None

Ids = list[int]


def lookup_py(text: str, kept: dict[str, Ids], words: dict[str, Ids]) -> tuple[list, list[int] | None,
                                                                               list[str] | None, int]:
    """``lookup`` in Python. ``str.split(" ")`` (5x the regex's speed) gives the first word, then one part per
    space: a part is that space's word, "" for a space followed by another (``_space_runs`` joins those)."""
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
    """``join`` in Python."""
    return list(chain.from_iterable(found))


if native_word_pieces is not None:
    lookup, join, NATIVE = native_word_pieces.lookup, native_word_pieces.join, True
else:
    lookup, join, NATIVE = lookup_py, join_py, False


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
