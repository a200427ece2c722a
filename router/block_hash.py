"""Block hashes identical to SGLang 0.5.23's page hashes (plain requests).

SGLang (``sglang/srt/mem_cache/utils.py``) hashes each *full* page of ``page_size`` token ids:
SHA-256 over the previous page's full 32-byte digest (absent for the first page) followed by each
token id as uint32 little-endian. KV events carry the first 8 digest bytes read as a signed
big-endian int64. Requests with LoRA, ``cache_salt`` or ``extra_key`` use namespaced hashes that
this function does not produce; callers must not claim affinity for them.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import NewType

BlockHash = NewType("BlockHash", int)
"""A page hash as SGLang reports it in KV events: signed 64-bit."""


def block_hashes(token_ids: Sequence[int], page_size: int) -> list[BlockHash]:
    """Hashes of every full page of ``token_ids``, in order; a trailing partial page is not hashed."""
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    pack = struct.Struct(f"<{page_size}I").pack
    hashes: list[BlockHash] = []
    parent: bytes | None = None
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        h = hashlib.sha256()
        if parent is not None:
            h.update(parent)
        h.update(pack(*token_ids[start : start + page_size]))
        parent = h.digest()
        hashes.append(BlockHash(int.from_bytes(parent[:8], "big", signed=True)))
    return hashes
