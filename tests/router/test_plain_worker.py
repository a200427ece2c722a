"""Plain SGLang workers (no ``/sgl_moe/info``): what the router learns from ``/server_info`` and ``/model_info``,
what its flags override, where each field came from (``GET /workers``), and the refusals that name the flag to
pass. The worker is a stand-in answering as SGLang 0.5.23 does (its payloads trimmed from a real server's)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.flops import FlopsModel
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.service import ROUTER, build_app
from sgl_moe.router.membership.plain_worker import build_info, kv_event_endpoints
from sgl_moe.router.membership.worker import WorkerError
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.wire import KvEventEndpoint

MODEL = str(DEFAULT_MODEL_DIR)
FLOPS = FlopsModel.from_hf_config(json.loads((DEFAULT_MODEL_DIR / "config.json").read_text()))
REMOTE = "org/tiny-qwen3-moe"
"""A model path that is not a directory on the router's machine (a hub id, or a path on another host)."""


def server_info(model_path: str = MODEL, **changes: Any) -> dict[str, Any]:
    info = {
        "model_path": model_path, "tokenizer_path": model_path, "served_model_name": "tiny", "page_size": 16,
        "context_length": None, "dp_size": 1, "chunked_prefill_size": 4096, "max_prefill_tokens": 16384,
        "disable_radix_cache": False, "device": "cpu", "version": "0.5.23", "random_seed": 13712314,
        "startup_time": {"load_weight": 0.195, "tokenizer_e2e": 15.01},
        "kv_events_config": '{"publisher":"zmq","endpoint":"tcp://*:32555","replay_endpoint":"tcp://*:33555",'
                            '"bind":true,"topic":"kv"}',
        "kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 32555, "topic": "kv",
                      "block_size": 16, "dp_size": 1, "replay_endpoint_port_base": 33555},
    }
    return {**info, **changes}


def model_info(model_path: str = MODEL, **changes: Any) -> dict[str, Any]:
    return {"model_path": model_path, "served_model_name": "tiny", "tokenizer_path": model_path,
            "is_generation": True, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], **changes}


@dataclass
class PlainStandIn:
    """A plain SGLang server: its info endpoints, /health and /generate (which records what it was sent)."""

    server: dict[str, Any]
    model: dict[str, Any]
    old_paths: bool = False
    """Serve ``/get_server_info`` and ``/get_model_info`` only, as SGLang before 0.5.23 did."""
    received: list[dict] = field(default_factory=list)

    def app(self) -> web.Application:
        async def generate(request: web.Request) -> web.Response:
            self.received.append(orjson.loads(await request.read()))
            return web.json_response({"text": "x", "meta_info": {"prompt_tokens": 1, "cached_tokens": 0}})

        def static(data: dict) -> Any:
            async def get(request: web.Request) -> web.Response:
                return web.json_response(data)
            return get

        app = web.Application()
        prefix = "/get_" if self.old_paths else "/"
        app.router.add_get(f"{prefix}server_info", static(self.server))
        app.router.add_get(f"{prefix}model_info", static(self.model))
        app.router.add_get("/health", static({}))
        app.router.add_post("/generate", generate)
        return app


class Router:
    """The router app (with ``cfg`` flags) and a worker app, both served in-process for one test."""

    def __init__(self, worker_app: web.Application, **cfg: Any) -> None:
        self.worker = TestServer(worker_app)
        self.client = TestClient(TestServer(build_app(RouterConfig(**cfg))))

    async def __aenter__(self) -> Router:
        await self.worker.start_server()
        await self.client.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.worker.close()

    async def add_worker(self) -> tuple[int, dict]:
        resp = await self.client.post("/workers", json={"url": str(self.worker.make_url("")).rstrip("/")})
        return resp.status, await resp.json()

    async def workers(self) -> list[dict]:
        return (await (await self.client.get("/workers")).json())["workers"]


def added(stand_in: PlainStandIn, **cfg: Any) -> tuple[int, dict]:
    """POST /workers the stand-in to a router with ``cfg`` flags: (status, body)."""
    async def scenario() -> tuple[int, dict]:
        async with Router(stand_in.app(), **cfg) as router:
            return await router.add_worker()
    return asyncio.run(scenario())


def test_workers_reports_what_was_learned_and_from_where():
    stand_in = PlainStandIn(server_info(), model_info())

    async def scenario() -> None:
        async with Router(stand_in.app()) as router:
            status, body = await router.add_worker()
            assert status == 201, body
            [w] = await router.workers()
            assert (w["model"], w["model_path"], w["page_size"], w["dp_size"], w["context_length"]) == (
                "tiny", MODEL, 16, 1, 4096)
            learned = w["learned"]
            assert learned["model_name"] == "model info (GET /model_info: served_model_name)"
            assert learned["page_size"] == "server info (GET /server_info: page_size)"
            assert learned["kv_events"] == "server info (GET /server_info: kv_events)"
            assert learned["context_length"] == f"local config {MODEL}/config.json"
            assert learned["flops"] == f"local config {MODEL}/config.json (the server's model_path, read on the " \
                                       "router's machine)"
            assert learned["tokenizer"].startswith(f"local directory {MODEL} (the server's tokenizer_path")
            assert learned["saturation"].startswith("derived by the router")
            assert "chunked_prefill_size" in learned["saturation"]
            assert w["theta_flops"] == FLOPS.request_flops(0, 4096) and w["theta_source"].startswith("router: ")
            # The wildcard bind is reached on the worker's own host, rank 0 on the base port.
            assert [e["endpoint"] for e in w["events"]] == ["tcp://127.0.0.1:32555"]
            resp = await router.client.post("/generate", json={"text": "hello plain worker",
                                                               "sampling_params": {"max_new_tokens": 1}})
            assert resp.status == 200 and len(stand_in.received) == 1

    asyncio.run(scenario())


def test_flags_fill_what_the_router_cannot_read_remotely():
    status, w = added(PlainStandIn(server_info(REMOTE), model_info(REMOTE)), tokenizer_path=MODEL, model_dir=MODEL)
    assert status == 201, w
    assert w["model_path"] == REMOTE
    assert w["learned"]["tokenizer"] == f"local directory {MODEL} (router flag --tokenizer-path)"
    assert w["learned"]["flops"] == f"local config {MODEL}/config.json (router flag --model-dir)"


@pytest.mark.parametrize("flags, needle", [({}, "--model-dir"), ({"model_dir": MODEL}, "--tokenizer-path")])
def test_a_worker_missing_what_the_router_needs_is_refused_naming_the_flag(flags, needle):
    status, body = added(PlainStandIn(server_info(REMOTE), model_info(REMOTE)), **flags)
    message = body["error"]["message"]
    assert status == 400 and needle in message and "plain SGLang worker" in message, body


def test_a_model_dir_for_another_model_is_refused():
    stand_in = PlainStandIn(server_info(REMOTE), model_info(REMOTE, architectures=["LlamaForCausalLM"]))
    status, body = added(stand_in, tokenizer_path=MODEL, model_dir=MODEL)
    assert status == 400 and "LlamaForCausalLM" in body["error"]["message"], body


def test_a_server_that_is_not_sglang_is_refused(caplog: pytest.LogCaptureFixture):
    """Refused with one answer that names no network detail (``POST /workers`` must not scan ports); the
    router's log says why."""
    async def scenario() -> tuple[int, dict]:
        async with Router(web.Application()) as router:
            return await router.add_worker()

    status, body = asyncio.run(scenario())
    assert status == 400 and "did not answer as an SGLang worker" in body["error"]["message"], body
    assert "nor an SGLang server" in caplog.text


def test_older_sglang_paths_and_the_raw_kv_events_config():
    """Before 0.5.23: ``/get_server_info`` and no ``kv_events`` descriptor, so the raw flag is parsed."""
    server = server_info()
    del server["kv_events"]
    status, w = added(PlainStandIn(server, model_info(), old_paths=True))
    assert status == 201, w
    assert w["learned"]["page_size"] == "server info (GET /get_server_info: page_size)"
    assert w["learned"]["kv_events"] == "server info (GET /get_server_info: kv_events_config)"
    assert [e["endpoint"] for e in w["events"]] == ["tcp://127.0.0.1:32555"]


def test_a_restarted_plain_worker_is_seen_as_restarted():
    """SGLang publishes no instance id; the router's stand-in for one changes with each start."""
    stand_in = PlainStandIn(server_info(), model_info())

    async def scenario() -> None:
        async with Router(stand_in.app()) as router:
            status, body = await router.add_worker()
            assert status == 201, body
            pool = router.client.server.app[ROUTER].pool
            [w] = pool.workers.values()
            pool.mark_unhealthy(w, "test")
            await pool.health.readmit(w)  # the same server answering again
            assert (w.state, w.counters.restarts) == ("healthy", 0)
            stand_in.server["startup_time"] = {"load_weight": 0.2, "tokenizer_e2e": 14.9}
            pool.mark_unhealthy(w, "test")
            await pool.health.readmit(w)
            assert (w.state, w.counters.restarts) == ("healthy", 1)
            assert w.learned["instance_id"].startswith("server info") and w.theta_source.startswith("router: ")

    asyncio.run(scenario())


# -- the pure part: build_info --------------------------------------------------------------------------------
def build(cfg: RouterConfig | None = None, server: dict | None = None, model: dict | None = None):
    return build_info("http://w:1", cfg or RouterConfig(), server or server_info(), "/server_info",
                      model or model_info(), "/model_info")


def test_flags_override_page_size_and_kv_events():
    cfg = RouterConfig(page_size=32, kv_events_config=json.dumps(
        {"publisher": "zmq", "endpoint": "tcp://10.0.0.5:7000", "replay_endpoint": "tcp://10.0.0.5:7100",
         "topic": "t"}))
    info, learned = build(cfg, server_info(dp_size=2, kv_events=None))
    assert info.page_size == 32 and learned["page_size"] == "router flag --page-size"
    assert info.kv_events == [KvEventEndpoint(r, f"tcp://10.0.0.5:{7000 + r}", f"tcp://10.0.0.5:{7100 + r}", "t")
                              for r in range(2)]
    assert learned["kv_events"] == "router flag --kv-events-config" and learned["dp_size"].endswith(": dp_size)")
    info, learned = build(RouterConfig(kv_events_config='{"publisher": "null"}'))
    assert info.kv_events == [] and learned["kv_events"] == "router flag --kv-events-config: no publisher"


def test_server_without_a_publisher_and_the_publishers_block_size():
    info, learned = build(server=server_info(kv_events=None))
    assert info.kv_events == [] and learned["kv_events"].endswith("kv_events): no publisher")
    # The publisher hashes at its block size (page x decode-context-parallel size): the router follows it.
    desc = {**server_info()["kv_events"], "block_size": 32, "dp_size": 2}
    info, learned = build(server=server_info(kv_events=desc))
    assert (info.page_size, info.dp_size, len(info.kv_events)) == (32, 2, 2)
    assert learned["page_size"].endswith("kv_events.block_size)")


def test_theta_from_the_step_the_server_reports_or_the_routers_flag():
    info, learned = build(server=server_info(chunked_prefill_size=-1))
    assert info.saturation.step_tokens == 16384 and info.saturation.flops == FLOPS.request_flops(0, 16384)
    assert "max_prefill_tokens" in learned["saturation"]
    bare = server_info()
    del bare["chunked_prefill_size"], bare["max_prefill_tokens"]
    with pytest.raises(WorkerError) as exc:
        build(server=bare)
    assert exc.value.status == 400 and "--saturation-flops" in exc.value.message
    info, learned = build(RouterConfig(saturation_flops=5e9), bare)
    assert info.saturation.flops == 5e9 and learned["saturation"] == "router flag --saturation-flops"


def test_instance_id_changes_when_the_server_restarts():
    first, _ = build()
    again, _ = build()
    restarted, _ = build(server=server_info(startup_time={"load_weight": 0.2, "tokenizer_e2e": 14.9}))
    assert first.instance_id == again.instance_id != restarted.instance_id


def test_an_sgl_moe_worker_reports_its_info_itself():
    index = BlockIndex()
    pool = WorkerPool.without_http(RouterConfig(), index, PendingLedger(index, 10.0), on_change=lambda: None)
    info, _ = build()
    w = pool.admit("http://a", info)
    assert w.describe(index)["learned"] == {"info": "the worker itself (GET /sgl_moe/info)"}
    assert w.theta_source.startswith("worker: ")


@pytest.mark.parametrize("flags, needle", [
    (["--tokenizer-path", "/nonexistent"], "--tokenizer-path"),
    (["--model-dir", "/nonexistent"], "--model-dir"),
    (["--page-size", "0"], "--page-size"),
    (["--kv-events-config", "{"], "--kv-events-config"),
    (["--kv-events-config", '{"publisher": "zmq", "endpoint": "ipc:///tmp/x"}'], "tcp://HOST:PORT"),
])
def test_bad_flags_are_refused_when_the_config_is_built(flags, needle):
    with pytest.raises(ValueError, match=needle.replace("/", ".")):
        RouterConfig.from_argv(flags)
    assert RouterConfig.from_argv(["--tokenizer-path", MODEL, "--model-dir", MODEL]).tokenizer_path == MODEL


def test_kv_event_endpoints_defaults():
    assert kv_event_endpoints('{"publisher": "zmq"}', 1) == [KvEventEndpoint(0, "tcp://*:5557", None, "")]
    assert kv_event_endpoints("{}", 3) == []
