"""A parsed request's placement keys: SGLang's page hashes of each prompt, or none when the request cannot share
plain blocks (it is then placed by load alone)."""

from __future__ import annotations

from sgl_moe.router.request.block_hash import PackedHashes, block_hashes_packed, salt_seed
from sgl_moe.router.request.parsed_request import ParsedRequest
from sgl_moe.router.request.prefix_memo import page_hashes


def prompt_keys(parsed: ParsedRequest, page_size: int) -> list[PackedHashes]:
    """``Job.keys`` for ``parsed``: the block hashes of each prompt (packed), ``[]`` for no affinity. LoRA and
    ``extra_key`` blocks are published without their namespace, so they get no affinity (``block_hash``)."""
    ns = parsed.namespace
    if not parsed.affinity or ns.lora_name is not None or ns.extra_key is not None:
        return []
    seed = salt_seed(ns.cache_salt) if ns.cache_salt else None
    paths = parsed.memo_paths or [()] * len(parsed.prompts)
    return [page_hashes(path, p, page_size, seed) if path else block_hashes_packed(p, page_size, seed)
            for p, path in zip(parsed.prompts, paths)]
