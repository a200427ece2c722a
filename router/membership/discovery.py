"""Discovery: what a worker URL serves, learned over HTTP, and whether it may join the pool.

A worker is described by ``GET /sgl_moe/info``, decoded once into ``WorkerInfo`` (a reply that does not
decode is refused with a 400 naming the field), and by its tokenizer files (every file SGLang's
``AutoTokenizer`` may read), which the router loads as SGLang does to hash prompts exactly as the worker's cache does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from sgl_moe.router.membership.plain_worker import PlainWorkers
from sgl_moe.router.membership.worker import WorkerError
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.wire import (
    INFO_PATH,
    TOKENIZER_FILES_PATH,
    TokenizerFiles,
    WireError,
    WorkerInfo,
    decode_info,
    is_tokenizer_file_name,
)


class Discovery:
    """Reads a worker's info and tokenizer through the router's one HTTP session."""

    def __init__(self, session: aiohttp.ClientSession | None, plain: PlainWorkers | None = None) -> None:
        self.session = session
        self.plain = plain
        """Reads plain SGLang workers (no ``/sgl_moe/info``); None: they are refused."""

    async def get(self, url: str, timeout: float = 10.0) -> aiohttp.ClientResponse:
        return await self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout))

    async def fetch_info(self, url: str) -> WorkerInfo:
        try:
            async with await self.get(f"{url}{INFO_PATH}") as resp:
                if resp.status == 404 and self.plain is not None:
                    return await self.plain.read(self.get, url)
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
        """The worker's tokenizer, loaded from its files as SGLang loads it (off the event loop: it takes
        tens of milliseconds, and the first load imports transformers)."""
        if self.plain is not None and self.plain.learned_about(url, info) is not None:
            return await asyncio.to_thread(self.plain.tokenizer, info)  # from the router's local directory
        files = await self.fetch_tokenizer_files(url, info.tokenizer)
        try:
            return await asyncio.to_thread(RouterTokenizer.from_file_bytes, files)
        except Exception as exc:  # transformers and the tokenizers library raise many types on bad files
            raise WorkerError(400, f"{url}: cannot load the worker's tokenizer from {sorted(files)}: "
                                   f"{type(exc).__name__}: {exc}") from None

    async def fetch_tokenizer_files(self, url: str, tok: TokenizerFiles) -> dict[str, bytes]:
        """Name -> bytes of every tokenizer file the worker serves (an older worker: the two it serves)."""
        if tok.files:
            paths = {name: f"{TOKENIZER_FILES_PATH}/{name}" for name in tok.files if is_tokenizer_file_name(name)}
        else:
            paths = {name: path for name, path in (("tokenizer.json", tok.tokenizer_json_url),
                                                   ("tokenizer_config.json", tok.tokenizer_config_url)) if path}
        if not paths:
            raise WorkerError(400, f"{url}: the worker serves no tokenizer files (its tokenizer path: {tok.path!r}); "
                                   "the router needs them to hash prompts")

        async def fetch(path: str) -> bytes:
            async with await self.get(url + path, timeout=60) as resp:
                resp.raise_for_status()
                return await resp.read()

        try:
            bodies = await asyncio.gather(*(fetch(path) for path in paths.values()))
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise WorkerError(502, f"cannot fetch the tokenizer from {url}: {exc}") from None
        return dict(zip(paths, bodies, strict=True))


def decode(url: str, data: Any) -> WorkerInfo:
    """``WorkerInfo`` from the parsed JSON of ``GET /sgl_moe/info``; a 400 naming the field that does not fit."""
    if not isinstance(data, dict):
        raise WorkerError(400, f"{url}: {INFO_PATH} is not a JSON object (incompatible sgl_moe version?)")
    try:
        return decode_info(data)
    except WireError as exc:
        raise WorkerError(400, f"{url}: {exc} (incompatible sgl_moe version?)", sglang=True) from None


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
