"""Membership without HTTP: decoding a worker's info, compatibility, Θ, slots, and the KV-event sink."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.flops import FlopsModel
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.discovery import Discovery, decode
from sgl_moe.router.membership.event_listener import EventSource
from sgl_moe.router.membership.kv_events import BlockStored, EventBatch
from sgl_moe.router.membership.worker import WorkerError
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.wire import KvEventEndpoint, SaturationInfo, TokenizerFiles, WorkerInfo, to_builtins
from sgl_moe.worker.info import tokenizer_files

FLOPS = FlopsModel(linear_flops_per_token=1000.0, attn_flops_per_pair=10.0, lm_head_flops_per_token=100.0,
                   num_layers=2, num_moe_layers=2)
INFO = WorkerInfo(model_name="m", page_size=16, flops=FLOPS, saturation=SaturationInfo(5e9, "fixed source", "fixed"),
                  instance_id="i1", context_length=4096)


def pool(**cfg) -> tuple[WorkerPool, list[int]]:
    index = BlockIndex()
    changes: list[int] = []
    return WorkerPool.without_http(RouterConfig(**cfg), index, PendingLedger(index, 10.0),
                                   on_change=lambda: changes.append(1)), changes


def test_info_that_does_not_decode_is_a_400_naming_the_field():
    data = to_builtins(INFO)
    assert decode("http://w", data) == INFO
    del data["flops"]
    with pytest.raises(WorkerError) as exc:
        decode("http://w", data)
    assert exc.value.status == 400 and "flops" in exc.value.message
    with pytest.raises(WorkerError) as exc:
        decode("http://w", {**to_builtins(INFO), "page_size": "16"})
    assert exc.value.status == 400 and "page_size" in exc.value.message
    with pytest.raises(WorkerError) as exc:
        decode("http://w", [1])
    assert exc.value.status == 400


def test_admit_installs_theta_from_the_worker_unless_the_router_pins_it():
    p, _ = pool()
    w = p.admit("http://a", INFO)
    assert (w.id, w.theta, w.theta_source, w.flops) == ("w0", 5e9, "worker: fixed source", FLOPS)
    assert (p.model_name, p.page_size, p.context_length) == ("m", 16, 4096)
    calibrated = replace(INFO, saturation=SaturationInfo(7e9, "calibrated source", "calibrated"))
    p.install(w, calibrated)
    assert (w.theta, w.theta_source, w.info) == (7e9, "worker: calibrated source", calibrated)
    assert p.installs == 2  # the join's and the calibrated one: the scheduler rebuilds its load-ordered view
    pinned, _ = pool(saturation_flops=1e9)
    w = pinned.admit("http://a", INFO)
    assert (w.theta, w.theta_source) == (1e9, "router flag --saturation-flops")
    pinned.install(w, calibrated)
    assert w.theta == 1e9 and w.info is calibrated


def test_admit_refuses_an_incompatible_worker_and_gives_each_dp_rank_a_slot():
    p, _ = pool()
    p.admit("http://a", INFO)
    for other in (replace(INFO, page_size=32), replace(INFO, model_name="other")):
        with pytest.raises(WorkerError) as exc:
            p.admit("http://b", other)
        assert exc.value.status == 409
    ranks = [KvEventEndpoint(dp_rank=r, endpoint=f"tcp://*:{5000 + r}") for r in range(2)]
    w = p.admit("http://c", replace(INFO, kv_events=ranks), worker_id="dp")
    assert w.id == "dp" and sorted(w.slots) == [0, 1]
    assert all(p.worker_of_slot(slot) is w for slot in w.slots.values())
    assert [x.id for x in p.routable()] == ["w0", "dp"] and [x.id for x in p.routable(frozenset({"w0"}))] == ["dp"]


def test_event_sink_stores_blocks_and_reports_capacity():
    p, changes = pool()
    w = p.admit("http://a", INFO)
    source = EventSource(worker_id=w.id, dp_rank=0, endpoint="tcp://a:1", replay_endpoint=None)
    stored = BlockStored(block_hashes=[1, 2], parent_block_hash=None, block_size=16)
    p.events.on_batch(source, EventBatch(seq=1, ts=0.0, events=[stored], dp_rank=0))
    assert p.index.committed_prefix(w.slots[0], [1, 2, 3]) == 2 and changes == [1]
    assert w.counters.events_stored == 2
    p.events.on_reset(source, "test")
    assert p.index.committed_prefix(w.slots[0], [1]) == 0 and w.counters.table_resets == 1


def fetch_tokenizer(tokenizer: TokenizerFiles, serve_dir, missing: frozenset[str] = frozenset()):
    """Discovery's tokenizer fetch against a stand-in serving ``serve_dir`` on both routes; (result, paths asked)."""
    asked: list[str] = []

    async def file(request):
        asked.append(request.path)
        name = request.match_info["name"]
        path = serve_dir / name
        return web.FileResponse(path) if path.is_file() and name not in missing else web.Response(status=404)

    async def scenario():
        app = web.Application()
        app.router.add_get("/sgl_moe/tokenizer/{name:.+}", file)
        app.router.add_get("/sgl_moe/{name:tokenizer(_config)?\\.json}", file)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as session:
                return await Discovery(session).fetch_tokenizer(url, replace(INFO, tokenizer=tokenizer))
        except WorkerError as exc:
            return exc
        finally:
            await runner.cleanup()

    return asyncio.run(scenario()), asked


def test_discovery_fetches_every_tokenizer_file_the_worker_serves(llama_model_dir):
    files = tokenizer_files(str(llama_model_dir))
    tok, asked = fetch_tokenizer(files, llama_model_dir)
    assert sorted(asked) == sorted(f"/sgl_moe/tokenizer/{name}" for name in files.files)
    assert "tokenizer.model" in files.files and "special_tokens_map.json" in files.files
    local = RouterTokenizer.from_dir(llama_model_dir)
    assert tok.exact and type(tok.hf) is type(local.hf) and tok.encode("hi there") == local.encode("hi there")
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<s>[INST] x [/INST]"


def test_discovery_reads_an_older_worker_from_its_two_routes():
    old = replace(tokenizer_files(str(DEFAULT_MODEL_DIR)), files=[])
    tok, asked = fetch_tokenizer(old, DEFAULT_MODEL_DIR)
    assert sorted(asked) == ["/sgl_moe/tokenizer.json", "/sgl_moe/tokenizer_config.json"]
    assert tok.exact and tok.encode("hi there") == RouterTokenizer.from_dir(DEFAULT_MODEL_DIR).encode("hi there")


def test_discovery_refuses_what_it_cannot_fetch_or_must_not_write():
    files = tokenizer_files(str(DEFAULT_MODEL_DIR))
    exc, _ = fetch_tokenizer(files, DEFAULT_MODEL_DIR, missing=frozenset({"tokenizer.model"}))
    assert isinstance(exc, WorkerError) and exc.status == 502
    exc, asked = fetch_tokenizer(TokenizerFiles(path="/x", files=["../../etc/passwd"]), DEFAULT_MODEL_DIR)
    assert isinstance(exc, WorkerError) and exc.status == 400 and asked == []
    exc, _ = fetch_tokenizer(TokenizerFiles(path="/x", files=["config.json"]), DEFAULT_MODEL_DIR)
    assert isinstance(exc, WorkerError) and exc.status == 400 and "cannot load" in exc.message
