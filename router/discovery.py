"""Discovery: what a worker URL serves, learned over HTTP, and whether it may join the pool.

A worker is described by ``GET /sgl_moe/info``, decoded once into ``WorkerInfo`` (a reply that does not
decode is refused with a 400 naming the field), and by its tokenizer files, which the router needs to
hash prompts exactly as the worker's cache does.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from sgl_moe.router.router_tokenizer import RouterTokenizer
from sgl_moe.router.worker import WorkerError
from sgl_moe.wire import INFO_PATH, WireError, WorkerInfo, decode_info


class Discovery:
    """Reads a worker's info and tokenizer through the router's one HTTP session."""

    def __init__(self, session: aiohttp.ClientSession | None) -> None:
        self.session = session

    async def get(self, url: str, timeout: float = 10.0) -> aiohttp.ClientResponse:
        return await self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout))

    async def fetch_info(self, url: str) -> WorkerInfo:
        try:
            async with await self.get(f"{url}{INFO_PATH}") as resp:
                if resp.status == 404:
                    raise WorkerError(400, f"{url} is not an sgl_moe worker (GET {INFO_PATH} answered 404); "
                                           "start it with `python -m sgl_moe.launch_server`")
                if resp.status != 200:
                    raise WorkerError(502, f"{url}: GET {INFO_PATH} answered {resp.status}")
                data = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise WorkerError(502, f"cannot reach worker {url}: {type(exc).__name__}: {exc}") from None
        return decode(url, data)

    async def fetch_tokenizer(self, url: str, info: WorkerInfo) -> RouterTokenizer:
        tok = info.tokenizer
        if not tok.tokenizer_json_url:
            raise WorkerError(400, f"{url}: the worker's tokenizer has no tokenizer.json; the router needs it to "
                                   "hash prompts")
        try:
            async with await self.get(url + tok.tokenizer_json_url, timeout=60) as resp:
                resp.raise_for_status()
                tokenizer_json = await resp.read()
            config = None
            if tok.tokenizer_config_url:
                async with await self.get(url + tok.tokenizer_config_url, timeout=60) as resp:
                    resp.raise_for_status()
                    config = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise WorkerError(502, f"cannot fetch the tokenizer from {url}: {exc}") from None
        return RouterTokenizer.from_files(tokenizer_json, config)


def decode(url: str, data: Any) -> WorkerInfo:
    """``WorkerInfo`` from the parsed JSON of ``GET /sgl_moe/info``; a 400 naming the field that does not fit."""
    if not isinstance(data, dict):
        raise WorkerError(400, f"{url}: {INFO_PATH} is not a JSON object (incompatible sgl_moe version?)")
    try:
        return decode_info(data)
    except WireError as exc:
        raise WorkerError(400, f"{url}: {exc} (incompatible sgl_moe version?)") from None


def check_compatible(url: str, info: WorkerInfo, reference: WorkerInfo | None) -> None:
    """Refuse a worker whose cache could not share block hashes with the pool's (``reference``: the first)."""
    ref = reference
    if ref is None:
        return
    if info.model_name != ref.model_name or info.model_path != ref.model_path:
        raise WorkerError(409, f"refusing {url}: it serves model {info.model_name!r} ({info.model_path}), "
                               f"the pool serves {ref.model_name!r} ({ref.model_path})")
    if info.page_size != ref.page_size:
        raise WorkerError(409, f"refusing {url}: page size {info.page_size} differs from the pool's "
                               f"{ref.page_size}; block hashes would not match")
