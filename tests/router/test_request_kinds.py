"""Every request kind through the router, on both placement paths, with an exact and a non-exact tokenizer.

The router runs in-process (its aiohttp app) in front of two stand-in workers that serve the shipped model's
``/sgl_moe/info`` and tokenizer and record every body they receive. Each row asserts that the router itself
answers no 5xx, that the worker got the body the client meant (token ids in place of text only where the
router tokenizes exactly; the client's text unchanged otherwise), and that the router's errors have its one
JSON shape. A non-exact tokenizer (``exact`` False: any non-generic tokenizer class) routes without affinity.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from doubles.stand_in import StandIn, tokenizer_dir

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.attempt import RID_ENDPOINTS, single_prompt
from sgl_moe.router.front.service import ROUTER, build_app

TEXT = "The quick brown fox jumps over the lazy dog; " * 6
OTHER = "Pack my box with five dozen liquor jugs. " * 5
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXT}]
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAAB"
       "JRU5ErkJggg==")


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """Tokenizer directories without (False) and with (True) a chat template."""
    root = tmp_path_factory.mktemp("tokenizers")
    return {t: tokenizer_dir(root / ("chat" if t else "plain"), t) for t in (False, True)}


class Cluster:
    """The router app in front of two stand-ins; ``configure`` selects the placement path and exactness."""

    def __init__(self, tok_dir: Path, policy: str = "longest_block_match") -> None:
        self.policy = policy
        self.stand_ins = [StandIn(tok_dir) for _ in range(2)]
        self.fast_decisions = 0

    async def start(self) -> Cluster:
        self._servers = [TestServer(s.app()) for s in self.stand_ins]
        for s in self._servers:
            await s.start_server()
        urls = tuple(str(s.make_url("")).rstrip("/") for s in self._servers)
        # No prefix wait: the stand-ins publish no KV events, so a row repeating an earlier row's prompt would
        # wait the whole prefix_wait_s for blocks promised by that row's request.
        cfg = RouterConfig(worker_urls=urls, policy=self.policy, prefix_wait_s=0)
        self.client = TestClient(TestServer(build_app(cfg)))
        await self.client.start_server()
        self.router = self.client.server.app[ROUTER]
        deadline = time.monotonic() + 60  # the first tokenizer load imports transformers
        while not (len(self.router.pool.workers) == 2 and self.router.pool.tokenizer is not None):
            if time.monotonic() > deadline:
                await self.close()
                raise AssertionError("the stand-in workers did not join")
            await asyncio.sleep(0.01)
        self.tok = self.router.pool.tokenizer
        fast_path = self.router.scheduler.fast_path
        decide = fast_path.decide

        def counted(*args):
            self.fast_decisions += 1
            return decide(*args)

        fast_path.decide = counted
        return self

    def configure(self, *, path: str, exact: bool) -> Cluster:
        """``path`` "fast" or "scan" (``Scheduler.scan_all``); ``exact``: the attribute the router reads to
        decide on affinity and on forwarding token ids. Forgets what the stand-ins received."""
        self.tok.exact = exact
        self.router.scheduler.scan_all = path == "scan"
        self.fast_decisions = 0
        for s in self.stand_ins:
            s.received.clear()
        return self

    async def close(self) -> None:
        await self.client.close()
        for s in self._servers:
            await s.close()

    def received(self) -> list[tuple[str, dict]]:
        return [r for s in self.stand_ins for r in s.received]


class Shared:
    """One event loop for the module and one cluster per tokenizer directory, started when first needed
    (loading a tokenizer takes a while); rows only reconfigure them."""

    def __init__(self, tok_dirs: dict[bool, Path]) -> None:
        self.tok_dirs = tok_dirs
        self.loop = asyncio.new_event_loop()
        self.clusters: dict[bool, Cluster] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def cluster(self, template: bool, *, path: str, exact: bool) -> Cluster:
        if template not in self.clusters:
            self.clusters[template] = self.run(Cluster(self.tok_dirs[template]).start())
        return self.clusters[template].configure(path=path, exact=exact)

    def close(self) -> None:
        for c in self.clusters.values():
            self.run(c.close())
        self.loop.close()


@pytest.fixture(scope="module")
def shared(tok_dirs: dict[bool, Path]) -> Iterator[Shared]:
    s = Shared(tok_dirs)
    yield s
    s.close()


# -- the rows ------------------------------------------------------------------------------------------
Expect = Callable[[dict, Any], dict]
"""``(client body, tokenizer) -> the body the worker must receive when the router tokenizes exactly``."""


def unchanged(body: dict, tok: Any) -> dict:
    return body


def text_as_ids(body: dict, tok: Any) -> dict:
    text = body["text"]
    ids = tok.encode(text) if isinstance(text, str) else [tok.encode(t) for t in text]
    return {**{k: v for k, v in body.items() if k != "text"}, "input_ids": ids}


def prompt_as_ids(body: dict, tok: Any) -> dict:
    prompt = body["prompt"]
    return {**body, "prompt": tok.encode(prompt) if isinstance(prompt, str) else [tok.encode(p) for p in prompt]}


def score_as_ids(body: dict, tok: Any) -> dict:
    return {**body, "query": [], "items": [tok.encode(body["query"] + i) for i in body["items"]]}


@dataclass(frozen=True)
class Row:
    name: str
    endpoint: str
    body: dict
    when_exact: Expect = unchanged
    template: bool = False
    error: int | None = None
    """The router answers this status itself (and forwards nothing)."""

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


ROWS = [
    Row("generate_text", "/generate", {"text": TEXT, "sampling_params": {"max_new_tokens": 2}}, text_as_ids),
    Row("generate_input_ids", "/generate", {"input_ids": list(range(5, 70)), "sampling_params": {"max_new_tokens": 1}}),
    Row("generate_batch_text", "/generate", {"text": [TEXT, OTHER]}, text_as_ids),
    Row("generate_batch_input_ids", "/generate", {"input_ids": [list(range(5, 70)), list(range(9, 40))]}),
    Row("generate_lora_path", "/generate", {"text": TEXT, "lora_path": "adapter-a"}, text_as_ids),
    Row("generate_extra_key", "/generate", {"text": TEXT, "extra_key": "tenant-7"}, text_as_ids),
    Row("generate_cache_salt", "/generate", {"text": TEXT, "cache_salt": "salt-1"}, text_as_ids),
    Row("generate_input_embeds", "/generate", {"input_embeds": [[0.01 * i] * 128 for i in range(20)]}),  # hidden 128
    Row("generate_image_data", "/generate", {"text": TEXT, "image_data": PNG}),
    Row("generate_stream", "/generate", {"text": TEXT, "stream": True}, text_as_ids),
    Row("completions_string", "/v1/completions", {"prompt": TEXT, "max_tokens": 2}, prompt_as_ids),
    Row("completions_list", "/v1/completions", {"prompt": [TEXT, OTHER], "max_tokens": 2}, prompt_as_ids),
    Row("chat_with_template", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}, template=True),
    Row("chat_without_template", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}, error=400),
    Row("chat_input_ids_without_template", "/v1/chat/completions",
        {"messages": MESSAGES, "input_ids": list(range(5, 60)), "max_tokens": 2}),
    Row("chat_stream", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "stream": True},
        template=True),
    Row("chat_image", "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                                   {"type": "image_url", "image_url": {"url": PNG}}]}],
         "max_tokens": 2}, template=True),
    Row("score", "/v1/score", {"query": TEXT, "items": [" yes", " no"], "label_token_ids": [5, 6]}, score_as_ids),
    Row("decisions", "/v1/decisions",
        {"input": TEXT, "questions": [{"id": "q", "type": "yes_no", "question": "Is it?"}]}, template=True),
    Row("unknown_field", "/generate", {"text": TEXT, "max_token": 3}, error=400),
]


def assert_error_shape(status: int, payload: bytes) -> None:
    body = orjson.loads(payload)
    assert list(body) == ["error"], body
    err = body["error"]
    assert list(err) == ["message", "type", "param", "code"], err
    assert isinstance(err["message"], str) and err["message"] and err["code"] == status, err


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "not_exact"])
@pytest.mark.parametrize("path", ["fast", "scan"])
@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_request_kind(row: Row, path: str, exact: bool, shared: Shared) -> None:
    c = shared.cluster(row.template, path=path, exact=exact)

    async def send() -> tuple[int, str, dict, bytes]:
        resp = await c.client.post(row.endpoint, data=orjson.dumps(row.body),
                                   headers={"content-type": "application/json"})
        return resp.status, resp.content_type, dict(resp.headers), await resp.read()

    status, content_type, headers, payload = shared.run(send())
    assert status < 500, payload[:500]
    if row.error is not None:
        assert status == row.error, payload[:500]
        assert_error_shape(status, payload)
        assert c.received() == []
        return
    assert status == 200, payload[:500]
    assert headers["x-sgl-moe-worker"] in c.router.pool.workers
    if row.stream:
        assert content_type == "text/event-stream" and payload.endswith(b"data: [DONE]\n\n")
    [(endpoint, got)] = c.received()
    assert endpoint == row.endpoint
    rid = got.pop("rid", None)  # the router names single generations so that it can abort them (intake)
    expect_rid = endpoint in RID_ENDPOINTS and single_prompt(endpoint, got) and "rid" not in row.body
    assert (rid is not None and rid.startswith("sgl-moe-")) if expect_rid else rid == row.body.get("rid"), rid
    assert got == (row.when_exact(row.body, c.tok) if exact else row.body)
    if path == "fast":
        assert c.fast_decisions >= 1
    else:
        assert c.fast_decisions == 0


@pytest.mark.parametrize("path", ["fast", "scan"])
@pytest.mark.parametrize("endpoint,body", [
    ("/generate", b"{not json"), ("/generate", b"[1, 2]"), ("/v1/score", b'{"query": "q"}'),
    ("/v1/completions", b'{"prompt": "x", "model": "some-other-model"}'), ("/v1/nowhere", b"{}"),
], ids=["bad_json", "not_object", "score_without_items", "unknown_model", "unknown_path"])
def test_router_errors_have_one_shape(endpoint: str, body: bytes, path: str, shared: Shared) -> None:
    c = shared.cluster(False, path=path, exact=True)

    async def send() -> tuple[int, bytes]:
        resp = await c.client.post(endpoint, data=body, headers={"content-type": "application/json"})
        return resp.status, await resp.read()

    status, payload = shared.run(send())
    assert 400 <= status < 500
    assert_error_shape(status, payload)
    assert c.received() == []


@pytest.mark.parametrize("path", ["fast", "scan"])
@pytest.mark.parametrize("policy", ["longest_block_match", "least_flops"])
def test_requests_without_affinity_take_turns_among_equally_loaded_workers(path: str, policy: str,
                                                                           shared: Shared) -> None:
    """Placed by load alone; two idle workers take turns rather than the lower id taking every request."""
    async def scenario() -> list[str]:
        c = (await Cluster(shared.tok_dirs[False], policy=policy).start()).configure(path=path, exact=False)
        try:
            out = []
            for i in range(4):
                resp = await c.client.post("/generate", json={"text": f"{TEXT} {i}"})
                assert resp.status == 200
                out.append(resp.headers["x-sgl-moe-worker"])
            return out
        finally:
            await c.close()

    workers = shared.run(scenario())
    assert workers[0] != workers[1] and workers[:2] == workers[2:]
