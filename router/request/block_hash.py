"""Block hashes identical to SGLang 0.5.23's page hashes (plain requests).

SGLang (``sglang/srt/mem_cache/utils.py``) hashes each *full* page of ``page_size`` token ids:
SHA-256 over the previous page's full 32-byte digest (absent for the first page) followed by each
token id as uint32 little-endian. KV events carry the first 8 digest bytes read as a signed
big-endian int64.

Namespaces (``sglang/srt/mem_cache/utils.py: compute_node_event_hash_values``): the hashes SGLang
*publishes* for a request with ``cache_salt`` start their chain from
``sha256(b"sglang-cache-salt-v1\0" + salt)`` instead of nothing (``salt_seed`` below). ``extra_key``
(and LoRA, which SGLang appends to ``extra_key``) is left out of published hashes, so such blocks are
indistinguishable from plain ones in events; callers must not claim affinity for those requests.

``block_hash_chain`` is the C extension ``native_page_hash`` (``native_page_hash.c``, built at install: no Python
call per page, SHA-256 from the libcrypto ``hashlib`` uses) when it was built, else ``block_hash_chain_py`` here,
which is its reference in the tests (``tests/router/test_native_paths.py``). ``NATIVE`` says which one runs.

``block_hashes_packed`` gives the same hashes as ``PackedHashes``, one buffer of int64s: the router's placement
keys (``prompt_keys``), which the C tables and prefix homes read where they lie. A list costs an int object per page
made here and read back by every table call (promise, match, retire, home), several per request.
"""

from __future__ import annotations

import array
import hashlib
import struct
import sys
from collections.abc import Sequence
from typing import NewType

BlockHash = NewType("BlockHash", int)
"""A page hash as SGLang reports it in KV events: signed 64-bit."""
FIRST_INT64 = struct.Struct(">q")
"""The first 8 digest bytes as a signed big-endian int64 (the event's hash)."""


class PackedHashes(array.array):
    """Block hashes as signed 64-bit ints in one buffer (an ``array`` of ``q``, made ``PackedHashes("q", raw)``): a
    prompt's (``block_hashes_packed``) and a KV event's (``kv_events``), which the C tables read without an int object
    per hash and answer packed in turn. A sequence of ints otherwise, equal to a list of the same ints (a slice is a
    plain ``array``)."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return self.tolist() == other if isinstance(other, list) else super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self == other


def salt_seed(cache_salt: str) -> bytes:
    """The digest SGLang chains a ``cache_salt`` request's first page onto in its KV events."""
    return hashlib.sha256(b"sglang-cache-salt-v1\0" + cache_salt.encode("utf-8")).digest()


def block_hashes(token_ids: Sequence[int], page_size: int, seed: bytes | None = None) -> list[BlockHash]:
    """Hashes of every full page of ``token_ids``, in order; a trailing partial page is not hashed.

    ``seed``: digest the first page chains onto (``salt_seed(cache_salt)``); ``None`` for plain requests.
    """
    return block_hash_chain(token_ids, page_size, seed)[0]


def block_hashes_packed(token_ids: Sequence[int], page_size: int, seed: bytes | None = None) -> PackedHashes:
    """``block_hashes``, packed."""
    return block_hash_chain_packed(token_ids, page_size, seed)[0]


def block_hash_chain_packed(token_ids: Sequence[int], page_size: int,
                            seed: bytes | None = None) -> tuple[PackedHashes, bytes | None]:
    """``block_hash_chain``, the hashes packed."""
    raw, digest = _chain_packed(token_ids, page_size, seed)
    return PackedHashes("q", raw), digest


def block_hash_chain_py(token_ids: Sequence[int], page_size: int,
                        seed: bytes | None = None) -> tuple[list[BlockHash], bytes | None]:
    """``block_hashes`` and the full digest of the last page hashed (``seed`` if none was).

    Hashing the tokens that follow with that digest as ``seed`` continues the chain: for ``a`` a whole
    number of pages, ``block_hashes(a + b) == block_hashes(a) + block_hash_chain(b, p, chain(a)[1])[0]``.
    """
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    tokens = array.array("I", token_ids)  # uint32; OverflowError for ids outside it, as in SGLang
    if sys.byteorder != "little":
        tokens.byteswap()
    data = tokens.tobytes()
    step = page_size * 4
    sha256, first_int64 = hashlib.sha256, FIRST_INT64.unpack_from
    parent = seed or b""
    hashes: list[BlockHash] = []
    append = hashes.append
    for offset in range(0, (len(token_ids) // page_size) * step, step):
        parent = sha256(parent + data[offset : offset + step]).digest()
        append(first_int64(parent)[0])  # a BlockHash (NewType's call costs a Python call per page: left out)
    return hashes, parent or seed


def _chain_packed_py(token_ids: Sequence[int], page_size: int, seed: bytes | None = None) -> tuple[bytes, bytes | None]:
    hashes, digest = block_hash_chain_py(token_ids, page_size, seed)
    return array.array("q", hashes).tobytes(), digest


try:
    from sgl_moe.router.request.native_page_hash import block_hash_chain
    from sgl_moe.router.request.native_page_hash import block_hash_chain_packed as _chain_packed
    NATIVE = True
except ImportError:  # no C compiler at install
    block_hash_chain, _chain_packed, NATIVE = block_hash_chain_py, _chain_packed_py, False
