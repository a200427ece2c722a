"""Stand-in HTTP workers for ``--smoke``: exercise the matrix machinery in seconds, without SGLang.

Each stand-in answers what the routers under test ask of a worker (``/health``, ``/sgl_moe/info`` with the
shipped model's tokenizer and FLOPs, ``/generate``, ``/flush_cache``) and keeps a page-granular LRU prefix
cache of bounded size, so ``cached_tokens`` in its answers depends on placement. Its latency is a linear
function of the tokens it computes, one batch at a time. By default it publishes no KV events (the router sees
only its own pending blocks); with ``kv_events`` it publishes, through SGLang's own ``ZmqEventPublisher``, the
pages each request stores and evicts in its cache, as a worker started by ``sgl_moe.launch_server`` does.
Figures measured against stand-ins say nothing about real performance: the smoke run checks that every scenario
runs every router and reports, nothing more.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from aiohttp import web

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.flops import FlopsModel
from sgl_moe.router.request.block_hash import block_hashes
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

PAGE = 16


@dataclass
class StandInWorker:
    pool_tokens: int = 4096
    """Prefix cache capacity in tokens (LRU over pages)."""
    per_token_s: float = 2e-5
    """Seconds per computed prompt token."""
    step_s: float = 2e-3
    """Fixed seconds per batch."""
    port: int = 0
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    tokenize: bool = True
    """False: answer without tokenizing or hashing (``prompt_tokens`` is the length of ``input_ids``, or of
    the text / 4; ``cached_tokens`` 0), so a text prompt (sglang-router's) costs the stand-in no more than
    token ids (sgl_moe's): for measuring what sits in front of the worker (benchmarks/router_capacity.py)."""
    kv_events: bool = False
    """Publish KV events with SGLang's ``ZmqEventPublisher`` (on loopback, with its replay socket) and declare them
    in ``/sgl_moe/info``: a request sent as ``input_ids`` stores its pages in the cache (``BlockStored`` for the new
    ones, ``BlockRemoved`` for the pages that made room), ``/flush_cache`` clears it (``AllBlocksCleared``). So the
    router's committed table and its promises' retirement work as in front of real workers. What a request gains and
    loses while a batch is being computed is published in one event batch when that batch ends, as SGLang 0.5.23's
    scheduler publishes once per prefill batch (``report_prefill_stats``) and when idle (``on_idle``); while nothing
    is being computed, at once. Needs SGLang (its import takes seconds: it loads torch)."""

    def __post_init__(self) -> None:
        self._cache: OrderedDict[int, None] = OrderedDict()
        self._waiting: list[tuple[int, asyncio.Future]] = []
        self._wake: asyncio.Event | None = None
        self._events = None
        """The ``ZmqEventPublisher`` (``kv_events``), made by ``publish_events``."""
        self._unpublished: list = []
        """Events made while a batch was being computed, published when it ends (``_emit``)."""
        self._busy = False
        """Whether the compute loop is inside a batch."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- cache -----------------------------------------------------------------------------------------
    def _match(self, hashes: list[int]) -> int:
        hit = 0
        for h in hashes:
            if h not in self._cache:
                break
            self._cache.move_to_end(h)
            hit += 1
        return hit

    def _store(self, hashes: list[int]) -> list[int]:
        """The pages enter the cache (the youngest); returns the oldest pages evicted to make room."""
        cache = self._cache
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        evicted = []
        while len(cache) * PAGE > self.pool_tokens:
            evicted.append(cache.popitem(last=False)[0])
        return evicted

    # -- KV events -------------------------------------------------------------------------------------------
    def publish_events(self) -> dict:
        """Start the publisher (loopback, any free ports); returns its ``WorkerInfo.kv_events`` entry."""
        from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

        self._events = ZmqEventPublisher(attn_dp_rank=0, endpoint="tcp://127.0.0.1:*",
                                         replay_endpoint="tcp://127.0.0.1:*", topic="kv", bind=True)
        described = self._events.describe_local_source(block_size=PAGE)
        return {"dp_rank": 0, "endpoint": described["endpoint"], "replay_endpoint": described["replay_endpoint"],
                "topic": described["topic"]}

    def stop_events(self) -> None:
        if self._events is not None:
            self._events.shutdown()
            self._events = None

    def _cache_prompt(self, ids: list[int], hashes: list[int], hit: int) -> None:
        """The prompt's pages enter the cache (its first ``hit`` were there); with ``kv_events``, what the cache
        gained and lost is published, evictions first (a prefill makes room before it stores)."""
        evicted = self._store(hashes)
        if self._events is None:
            return
        from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored

        events = []
        if evicted:
            events.append(BlockRemoved(block_hashes=evicted))
        if hit < len(hashes):
            events.append(BlockStored(block_hashes=hashes[hit:], parent_block_hash=hashes[hit - 1] if hit else None,
                                      token_ids=ids[hit * PAGE:len(hashes) * PAGE], block_size=PAGE, lora_id=None))
        if events:
            self._emit(events)

    def _emit(self, events: list) -> None:
        """Publish ``events`` now, or with the rest of the running batch's when it ends."""
        self._unpublished.extend(events)
        if not self._busy:
            self._publish_pending()

    def _publish_pending(self) -> None:
        if self._unpublished and self._events is not None:
            from sglang.srt.disaggregation.kv_events import KVEventBatch

            events, self._unpublished = self._unpublished, []
            self._events.publish(KVEventBatch(ts=time.time(), events=events, attn_dp_rank=0))

    # -- compute: one batch at a time, every waiting request in it -----------------------------------------
    async def _compute_loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._waiting = self._waiting, []
            if not batch:
                continue
            self._busy = True
            try:
                await asyncio.sleep(self.step_s + self.per_token_s * sum(n for n, _ in batch))
            finally:
                self._busy = False
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(None)
            self._publish_pending()  # the batch's events, and those of requests that came meanwhile

    async def _compute(self, tokens: int) -> None:
        assert self._wake is not None
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((tokens, fut))
        self._wake.set()
        await fut

    # -- HTTP ----------------------------------------------------------------------------------------------
    def app(self, tok: RouterTokenizer, info: dict) -> web.Application:
        app = web.Application()

        async def generate(request: web.Request) -> web.Response:
            body = await request.json()
            if not self.tokenize:
                n = len(body["input_ids"]) if "input_ids" in body else max(1, len(body.get("text") or "") // 4)
                if self._events is not None and "input_ids" in body:  # (sgl_moe's requests; the pages are hashed)
                    ids = body["input_ids"]
                    hashes = block_hashes(ids, PAGE, None)
                    self._cache_prompt(ids, hashes, self._match(hashes))
                await self._compute(n)
                return web.json_response({"text": "", "meta_info": {"prompt_tokens": n, "cached_tokens": 0,
                                                                   "completion_tokens": 1}})
            ids = body["input_ids"] if "input_ids" in body else tok.encode(body["text"])  # sgl_moe sends ids
            hashes = block_hashes(ids, PAGE, None)
            hit = self._match(hashes)
            cached = min(hit * PAGE, (len(ids) - 1) // PAGE * PAGE)
            await self._compute(len(ids) - cached)
            self._cache_prompt(ids, hashes, self._match(hashes))
            return web.json_response({"text": "", "meta_info": {"prompt_tokens": len(ids), "cached_tokens": cached,
                                                               "completion_tokens": 1}})

        async def flush(request: web.Request) -> web.Response:
            self._cache.clear()
            if self._events is not None:
                from sglang.srt.disaggregation.kv_events import AllBlocksCleared

                self._emit([AllBlocksCleared()])
            return web.Response(text="ok")

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def get_info(request: web.Request) -> web.Response:
            return web.json_response({**info, "instance_id": self.instance_id})

        async def model_info(request: web.Request) -> web.Response:
            return web.json_response({"model_path": "stand-in", "is_generation": True})

        async def tokenizer_file(request: web.Request) -> web.Response:
            return web.FileResponse(DEFAULT_MODEL_DIR / request.match_info["name"])

        app.router.add_post("/generate", generate)
        app.router.add_post("/flush_cache", flush)
        app.router.add_get("/flush_cache", flush)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, health)
        app.router.add_get("/sgl_moe/info", get_info)
        app.router.add_get("/get_model_info", model_info)
        app.router.add_get("/get_server_info", get_info)
        app.router.add_get("/sgl_moe/{name:tokenizer(_config)?\\.json}", tokenizer_file)
        return app


class StandInFleet:
    """``n`` stand-in workers served from one background event loop (the routers are subprocesses)."""

    def __init__(self, n: int, pool_tokens: int, **kw) -> None:
        self.workers = [StandInWorker(pool_tokens=pool_tokens, **kw) for _ in range(n)]
        self._loop = asyncio.new_event_loop()
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="policy_bench-standins", daemon=True)

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def start(self) -> StandInFleet:
        # sglang-router opens each connection with an HTTP/2 preface first; aiohttp logs a traceback for it.
        logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(60)
        return self

    async def _start(self) -> None:
        tok = RouterTokenizer.from_files((DEFAULT_MODEL_DIR / "tokenizer.json").read_bytes(),
                                         json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text()))
        config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
        flops = FlopsModel.from_hf_config(config)
        for w in self.workers:
            w._wake = asyncio.Event()
            self._tasks.append(self._loop.create_task(w._compute_loop()))
            info = {"model_name": "stand-in", "model_path": "stand-in", "page_size": PAGE, "dp_size": 1,
                    "context_length": 4096, "kv_events": [w.publish_events()] if w.kv_events else [],
                    "flops": flops.to_dict(),
                    "tokenizer": {"tokenizer_json_url": "/sgl_moe/tokenizer.json",
                                  "tokenizer_config_url": "/sgl_moe/tokenizer_config.json"},
                    "saturation": {"flops": flops.request_flops(0, 4096), "source": "stand-in: one 4096-token step",
                                   "state": "fixed", "step_tokens": 4096}}
            runner = web.AppRunner(w.app(tok, info), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", w.port)  # 0: any free port
            await site.start()
            w.port = runner.addresses[0][1]
            self._runners.append(runner)

    def stop(self) -> None:
        async def _stop() -> None:
            for task in self._tasks:
                task.cancel()
            for r in self._runners:
                await r.cleanup()
            for w in self.workers:
                w.stop_events()

        try:
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> StandInFleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
