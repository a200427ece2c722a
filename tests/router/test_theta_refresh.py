"""A worker still calibrating Θ when the router adds it: the router installs the calibrated value on receipt
(seed 000 App. B.4), unless its own --saturation-flops pins Θ. The worker is a stand-in HTTP server serving the
shipped model's info and tokenizer, so the test isolates the pool's refresh logic."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.flops import FlopsModel
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger


def _info(state: str, flops: float) -> dict:
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    return {"model_name": "tiny", "model_path": "tiny", "instance_id": "i1", "page_size": 16, "dp_size": 1,
            "context_length": 4096, "kv_events": [], "flops": FlopsModel.from_hf_config(config).to_dict(),
            "tokenizer": {"tokenizer_json_url": "/sgl_moe/tokenizer.json", "tokenizer_config_url": None},
            "saturation": {"flops": flops, "source": f"{state} source", "state": state}}


async def _stand_in(state: dict) -> web.AppRunner:
    app = web.Application()

    async def info(request):
        return web.json_response(state["info"])

    async def health(request):
        return web.Response(text="ok")

    async def tokenizer(request):
        return web.FileResponse(DEFAULT_MODEL_DIR / "tokenizer.json")

    app.router.add_get("/sgl_moe/info", info)
    app.router.add_get("/health", health)
    app.router.add_get("/sgl_moe/tokenizer.json", tokenizer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.mark.parametrize("pinned", [None, 5e9])
def test_calibrated_theta_replaces_the_fallback(pinned):
    async def scenario():
        state = {"info": _info("calibrating", 1e10)}
        runner = await _stand_in(state)
        port = runner.addresses[0][1]
        changes = []
        async with aiohttp.ClientSession() as session:
            index = BlockIndex()
            pool = WorkerPool(RouterConfig(saturation_flops=pinned), index, PendingLedger(index, 10.0), session,
                              on_change=lambda: changes.append(1))
            w = await pool.add(f"http://127.0.0.1:{port}")
            assert w.theta == (pinned or 1e10)
            await pool.health.check(w)  # still calibrating: unchanged
            assert w.theta == (pinned or 1e10)
            state["info"] = _info("calibrated", 3e10)
            before = len(changes)
            await pool.health.check(w)
            assert w.info.saturation.state == "calibrated"
            if pinned:
                assert w.theta == pinned and len(changes) == before
            else:
                assert w.theta == 3e10 and "calibrated source" in w.theta_source and len(changes) == before + 1
            state["info"] = _info("calibrated", 9e10)
            await pool.health.check(w)  # calibrated once: no further re-reads
            assert w.theta == (pinned or 3e10)
            await pool.close()
        await runner.cleanup()

    asyncio.run(scenario())
