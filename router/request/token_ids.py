"""A prompt's token ids packed as uint32 in one buffer, and their JSON text written from it.

The ids of a text the router encodes (``RouterTokenizer.encode_with_paths``) go from the piece table to the page
hashes and the worker-bound JSON. As a list of ints each id is an int object: made (or a shared one's reference count
touched, a cache miss in a table of megabytes) for the list, read again by the page hashes and again by orjson, then
released, about 4,000 times a 4,000-token prompt. ``TokenIds`` keeps them as 4-byte ints in one buffer (an ``array``
of ``I``, made ``TokenIds("I", ids)``): the piece table writes them there (``PieceTable(..., packed=True)``), the
prefix memo copies whole runs of them, the C page hash reads the buffer (``block_hash_chain``), and ``json_text``
writes the JSON from it. Otherwise it is a sequence of ints, equal to the list of the same ints; a slice of it is a
plain ``array``.

``json_text`` is the C function ``native_token_ids.json_text`` (``native_token_ids.c``) where it was built, else
``json_text_py``, its reference in the tests. ``NATIVE`` says which one runs.
"""

from __future__ import annotations

import array
from typing import Any

import orjson


class TokenIds(array.array):
    """Token ids as uint32 in one buffer (see the module): a sequence of ints, equal to a list of the same ints."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return self.tolist() == other if isinstance(other, list) else super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return f"TokenIds({self.tolist()!r})"

    def copy(self) -> TokenIds:
        return TokenIds("I", self)


def packed(ids: Any) -> TokenIds:
    """``ids`` (any sequence of ints in uint32's range) as ``TokenIds``; ``ids`` itself when it is one."""
    return ids if type(ids) is TokenIds else TokenIds("I", ids)


def as_list(value: Any) -> list[int]:
    """orjson's ``default`` for a body that holds ``TokenIds``: the list of the same ints (anything else is not JSON
    orjson can write)."""
    if isinstance(value, array.array):
        return value.tolist()
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def json_text_py(ids: Any, start: int = 0, end: int | None = None) -> bytes:
    """``orjson.dumps(list(ids[start:end]))``: the reference of the C ``json_text``."""
    return orjson.dumps(list(ids[start:end]))


try:
    from sgl_moe.router.request.native_token_ids import json_text
    NATIVE = True
except ImportError:  # no C compiler at install
    json_text, NATIVE = json_text_py, False
