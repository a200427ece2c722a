"""Hostile input at the router, in-process, in front of two stand-in workers (real HTTP, the shipped tokenizer).

What a worker would crash on is refused with 400 before dispatch, every request's work is bounded (413 for a
large body, 400 for too many prompts or tokens), keys guard the routes, and a worker already in the pool under
another URL is refused. The same claims against real SGLang workers are in ``tests/live/test_hardening_live.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from doubles.stand_in import StandIn, tokenizer_dir

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.attempt import Attempt
from sgl_moe.router.front.auth import allowed, bearer, route_level
from sgl_moe.router.front.service import ROUTER, build_app, describe_config
from sgl_moe.router.placement.suspects import Suspect, SuspectList

VOCAB = 4096  # the shipped model's config.json
HIDDEN = 128
API, ADMIN = "client-key-1", "admin-key-2"


class Setup:
    """A router app (given settings) in front of two stand-ins, on one event loop for the module."""

    def __init__(self, tok: Path) -> None:
        self.tok = tok
        self.loop = asyncio.new_event_loop()
        self.stand_ins = [StandIn(tok) for _ in range(2)]

        async def serve() -> list[TestServer]:
            servers = [TestServer(s.app()) for s in self.stand_ins]
            for server in servers:
                await server.start_server()
            return servers
        self.servers = self.loop.run_until_complete(serve())
        self.urls = tuple(str(s.make_url("")).rstrip("/") for s in self.servers)
        self.clients: dict[str, TestClient] = {}

    def client(self, name: str, **settings: Any) -> TestClient:
        if name not in self.clients:
            cfg = RouterConfig(worker_urls=self.urls, prefix_wait_s=0, **settings)

            async def start() -> TestClient:
                client = TestClient(TestServer(build_app(cfg)))
                await client.start_server()
                return client
            client = self.loop.run_until_complete(start())
            router = client.server.app[ROUTER]
            deadline = time.monotonic() + 60
            while not (len(router.pool.workers) == 2 and router.pool.tokenizer is not None):
                assert time.monotonic() < deadline, "stand-ins did not join"
                self.loop.run_until_complete(asyncio.sleep(0.02))
            self.clients[name] = client
        return self.clients[name]

    def call(self, client: TestClient, method: str, path: str, **kw: Any) -> tuple[int, Any, dict]:
        async def go() -> tuple[int, Any, dict]:
            async with client.request(method, path, **kw) as r:
                body = await r.json(content_type=None) if "json" in r.headers.get("content-type", "") else None
                return r.status, body, dict(r.headers)
        return self.loop.run_until_complete(go())

    def close(self) -> None:
        for c in self.clients.values():
            self.loop.run_until_complete(c.close())
        for s in self.servers:
            self.loop.run_until_complete(s.close())
        self.loop.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    s = Setup(tokenizer_dir(tmp_path_factory.mktemp("tok"), template=True))
    yield s
    s.close()


def received(setup: Setup) -> int:
    return sum(len(s.received) for s in setup.stand_ins)


# -- poison requests: refused before any worker sees them ------------------------------------------------------
POISON = [
    ("/generate", {"input_ids": [999_999_999]}, "input_ids"),
    ("/generate", {"input_ids": [1, 2, VOCAB]}, "input_ids"),
    ("/generate", {"input_ids": [[1, 2], [3, VOCAB + 5]]}, "input_ids"),
    ("/v1/completions", {"prompt": [5, VOCAB]}, "prompt"),
    ("/v1/score", {"query": [1, 2], "items": [[3], [VOCAB]]}, "items"),
    ("/v1/score", {"query": "a", "items": ["b"], "label_token_ids": [1, VOCAB]}, "label_token_ids"),
    ("/generate", {"input_ids": [1, 2], "token_ids_logprob": [VOCAB * 10]}, "token_ids_logprob"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"logit_bias": {str(VOCAB): 1.0}}}, "sampling_params"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"-1": 2.0}}, "logit_bias"),
    ("/generate", {"input_ids": [1, 2], "top_logprobs_num": VOCAB + 1}, "top_logprobs_num"),
    ("/generate", {"text": ""}, "text"),
    ("/generate", {"input_ids": []}, "input_ids"),
    ("/generate", {"input_embeds": [[0.1] * (HIDDEN + 1)]}, "input_embeds"),
    ("/generate", {"input_embeds": [[0.1] * HIDDEN, [0.2] * 3]}, "input_embeds"),
    ("/generate", {"input_embeds": [["x"] * HIDDEN]}, "input_embeds"),
]


@pytest.mark.parametrize(("path", "body", "param"), POISON, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(POISON)])
def test_inputs_a_worker_would_crash_on_are_400_before_dispatch(setup: Setup, path: str, body: dict, param: str):
    client = setup.client("open")
    before = received(setup)
    status, answer, _ = setup.call(client, "POST", path, json=body)
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert received(setup) == before  # no worker saw it


def test_in_vocabulary_ids_and_embeddings_of_the_right_width_pass(setup: Setup):
    client = setup.client("open")
    for body in ({"input_ids": [1, VOCAB - 1]}, {"input_embeds": [[0.5] * HIDDEN] * 3},
                 {"input_ids": [1, 2], "sampling_params": {"logit_bias": {str(VOCAB - 1): -1.0}}}):
        status, answer, _ = setup.call(client, "POST", "/generate", json=body)
        assert status == 200, answer


# -- bounded work --------------------------------------------------------------------------------------------
def test_a_body_over_the_limit_is_413_without_being_read(setup: Setup):
    client = setup.client("small", max_body_bytes=1000)
    status, answer, _ = setup.call(client, "POST", "/generate", json={"text": "x" * 5000})
    assert status == 413 and "--max-body-bytes" in answer["error"]["message"]

    async def chunks():  # no Content-Length: refused once the bytes read pass the limit
        yield b'{"text": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}'
    status, answer, _ = setup.call(client, "POST", "/generate", data=chunks())
    assert status == 413, answer


def test_prompt_count_and_token_limits(setup: Setup):
    client = setup.client("limits", max_prompts=4, max_request_tokens=50)
    before = received(setup)
    cases = [
        ({"text": ["a"] * 5}, "text", "--max-prompts"),
        ({"input_ids": [[1]] * 5}, "input_ids", "--max-prompts"),
        ({"input_ids": [1] * 51}, "input_ids", "--max-request-tokens"),
        ({"text": "z" * 100_000}, "text", "--max-request-tokens"),  # refused by length, before tokenizing
    ]
    for body, param, flag in cases:
        status, answer, _ = setup.call(client, "POST", "/generate", json=body)
        assert status == 400 and answer["error"]["param"] == param and flag in answer["error"]["message"], answer
    status, answer, _ = setup.call(client, "POST", "/v1/score", json={"query": "q", "items": ["i"] * 5})
    assert status == 400 and "--max-prompts" in answer["error"]["message"]
    assert received(setup) == before
    status, _, _ = setup.call(client, "POST", "/generate", json={"input_ids": [[1] * 10] * 4})
    assert status == 200


def test_parallel_samples_are_capped_before_tokenizing(setup: Setup):
    """``n`` over ``--max-n``, or ``n`` x prompts over ``--max-prompts``: 400 naming the flag, no worker sees it,
    and before the prompt is tokenized (a text far over ``--max-request-tokens`` still gets the ``n`` answer)."""
    client = setup.client("samples", max_n=4, max_prompts=10, max_request_tokens=50)
    before = received(setup)
    cases = [
        ("/generate", {"text": "hello", "sampling_params": {"n": 100_000, "max_new_tokens": 1}}, "sampling_params.n",
         "--max-n"),
        ("/generate", {"text": "z" * 1_000_000, "sampling_params": {"n": 5}}, "sampling_params.n", "--max-n"),
        ("/generate", {"input_ids": [1, 2], "sampling_params": {"beam_width": 9}}, "sampling_params.beam_width",
         "--max-n"),
        ("/generate", {"text": ["a", "b", "c"], "sampling_params": {"n": 4}}, "sampling_params.n", "--max-prompts"),
        ("/generate", {"text": ["a", "b", "c"], "sampling_params": [{"n": 4}] * 3}, "sampling_params.n",
         "--max-prompts"),
        ("/generate", {"text": "a", "sampling_params": {"n": "3"}}, "sampling_params.n", "positive integer"),
        ("/generate", {"text": "a", "sampling_params": {"n": 0}}, "sampling_params.n", "positive integer"),
        ("/v1/completions", {"prompt": "a", "n": 5}, "n", "--max-n"),
        ("/v1/completions", {"prompt": "a", "best_of": 50}, "best_of", "--max-n"),
        ("/v1/completions", {"prompt": ["a", "b", "c"], "n": 4}, "n", "--max-prompts"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 5}, "n", "--max-n"),
    ]
    for path, body, param, flag in cases:
        t0 = time.perf_counter()
        status, answer, _ = setup.call(client, "POST", path, json=body)
        assert status == 400 and answer["error"]["param"] == param and flag in answer["error"]["message"], answer
        assert time.perf_counter() - t0 < 1.0
    assert received(setup) == before
    for path, body in (("/generate", {"text": ["a", "b"], "sampling_params": {"n": 4, "max_new_tokens": 1}}),
                       ("/v1/completions", {"prompt": "a", "n": 4, "max_tokens": 1})):
        status, answer, _ = setup.call(client, "POST", path, json=body)
        assert status == 200, answer


def test_grammars_are_bounded_in_size_and_depth_before_dispatch(setup: Setup):
    client = setup.client("grammars", max_grammar_chars=2000, max_grammar_depth=8)
    before = received(setup)
    deep = "(" * 3000 + "a" + ")" * 3000
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    nested: dict = {"type": "string"}
    for _ in range(10):
        nested = {"type": "object", "properties": {"x": nested}}
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    cases = [
        ("/generate", {"text": "a", "sampling_params": {"regex": deep}}, "sampling_params.regex",
         "--max-grammar-chars"),
        ("/generate", {"text": "a", "sampling_params": {"regex": "(" * 9 + "a" + ")" * 9}}, "sampling_params.regex",
         "--max-grammar-depth"),
        ("/generate", {"text": "a", "sampling_params": {"json_schema": "x" * 2001}}, "sampling_params.json_schema",
         "--max-grammar-chars"),
        ("/generate", {"text": ["a", "b"], "sampling_params": [{}, {"ebnf": 'root ::= ' + "(" * 9 + '"a"' + ")" * 9}]},
         "sampling_params.ebnf", "--max-grammar-depth"),
        ("/generate", {"text": "a", "sampling_params": {"stop_regex": ["ok", "b" * 2001]}},
         "sampling_params.stop_regex", "--max-grammar-chars"),
        ("/v1/completions", {"prompt": "a", "regex": "(" * 9 + ")" * 9}, "regex", "--max-grammar-depth"),
        ("/v1/completions", {"prompt": "a", "json_schema": "[" * 9 + "]" * 9}, "json_schema", "--max-grammar-depth"),
        ("/v1/chat/completions", {**chat, "response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": nested}}}, "response_format", "--max-grammar-depth"),
        ("/v1/chat/completions", {**chat, "ebnf": "root ::= " + '"a" ' * 1000}, "ebnf", "--max-grammar-chars"),
    ]
    for path, body, param, flag in cases:
        status, answer, _ = setup.call(client, "POST", path, json=body)
        assert status == 400 and answer["error"]["param"] == param and flag in answer["error"]["message"], answer
    assert received(setup) == before
    fine = [("/generate", {"text": "a", "sampling_params": {"regex": r"\(?[0-9]{3}\)?-[0-9]{4}", "max_new_tokens": 1}}),
            ("/generate", {"text": "a", "sampling_params": {"json_schema": orjson.dumps(schema).decode()}}),
            ("/v1/chat/completions", {**chat, "response_format": {"type": "json_schema", "json_schema": {
                "name": "n", "schema": schema}}})]
    for path, body in fine:
        status, answer, _ = setup.call(client, "POST", path, json=body)
        assert status == 200, answer


def test_health_answers_while_a_large_request_is_tokenized(setup: Setup, monkeypatch: pytest.MonkeyPatch):
    """A large body is tokenized off the event loop: its encode is held open (in whatever thread runs it) until
    ``/health`` has answered. Were the encode on the event loop, the loop would sit in it until the hold times out,
    and ``/health`` would answer only after the encode had finished."""
    client = setup.client("open")
    tok = client.server.app[ROUTER].pool.tokenizer
    text = "lorem ipsum dolor sit amet, " * 140_000  # 3.9 MB: passes the length pre-check, fails after tokenizing
    entered, release = threading.Event(), threading.Event()
    inside: list[bool] = []
    encode = tok.encode_with_paths

    def held(texts: list[str]) -> Any:
        if len(texts[0]) < len(text):
            return encode(texts)
        inside.append(True)
        entered.set()
        release.wait(10)
        inside.append(False)
        return encode(texts)
    monkeypatch.setattr(tok, "encode_with_paths", held)

    async def go() -> tuple[bool, int]:
        big = asyncio.ensure_future(client.post("/generate", json={"text": text}))
        async with asyncio.timeout(30):
            while not entered.is_set():
                await asyncio.sleep(0.01)
        async with client.get("/health") as r:
            assert r.status == 200
        still_encoding = inside[-1]
        release.set()
        resp = await big
        status = resp.status
        resp.release()
        return still_encoding, status

    still_encoding, status = setup.loop.run_until_complete(go())
    assert still_encoding, "/health answered only after the large request's encode had finished"
    assert status == 400  # more tokens than --max-request-tokens allows: tokenized, then refused


# -- authentication -----------------------------------------------------------------------------------------
def test_route_levels_and_key_rules():
    cfg = RouterConfig(api_key=API, admin_api_key=ADMIN)
    assert route_level("POST", "/workers") == route_level("DELETE", "/workers/w0") == "admin"
    assert route_level("GET", "/health") == route_level("GET", "/metrics") == "open"
    assert route_level("POST", "/v1/score") == "client"
    assert allowed("client", API, cfg) and allowed("client", ADMIN, cfg) and not allowed("client", "x", cfg)
    assert allowed("admin", ADMIN, cfg) and not allowed("admin", API, cfg) and not allowed("admin", None, cfg)
    assert allowed("client", None, RouterConfig()) and allowed("admin", None, RouterConfig())
    only_admin = RouterConfig(admin_api_key=ADMIN)
    assert allowed("client", None, only_admin) and not allowed("admin", None, only_admin)  # as SGLang's
    assert bearer("Bearer abc") == "abc" and bearer("Basic abc") is None and bearer(None) is None


def test_keys_guard_routes_and_workers_get_the_client_key(setup: Setup):
    client = setup.client("keys", api_key=API, admin_api_key=ADMIN)
    for method, path, kw in (("POST", "/generate", {"json": {"input_ids": [1, 2]}}),
                             ("POST", "/workers", {"json": {"url": "http://127.0.0.1:9"}}),
                             ("DELETE", "/workers/w0", {}), ("GET", "/workers", {})):
        status, answer, headers = setup.call(client, method, path, **kw)
        assert status == 401 and headers.get("WWW-Authenticate") == "Bearer", (method, path, answer)
    status, _, _ = setup.call(client, "DELETE", "/workers/w0", headers={"Authorization": f"Bearer {API}"})
    assert status == 401  # the client key does not open admin routes
    assert setup.call(client, "GET", "/health")[0] == 200
    assert setup.call(client, "GET", "/metrics")[0] == 200
    before = [len(s.authorization) for s in setup.stand_ins]
    status, _, _ = setup.call(client, "POST", "/generate", json={"input_ids": [1, 2]},
                              headers={"Authorization": f"Bearer {ADMIN}"})
    assert status == 200
    sent = [a for s, n in zip(setup.stand_ins, before) for a in s.authorization[n:]]
    assert sent == [f"Bearer {API}"]  # the router's client key, never the caller's admin key
    assert setup.call(client, "GET", "/workers", headers={"Authorization": f"Bearer {ADMIN}"})[0] == 200


def test_non_loopback_bind_needs_an_admin_key(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SGL_MOE_ADMIN_API_KEY", raising=False)
    with pytest.raises(ValueError, match="--admin-api-key"):
        RouterConfig.from_argv(["--host", "0.0.0.0"])
    assert RouterConfig.from_argv(["--host", "0.0.0.0", "--allow-unauthenticated-admin"]).host == "0.0.0.0"
    monkeypatch.setenv("SGL_MOE_ADMIN_API_KEY", ADMIN)
    cfg = RouterConfig.from_argv(["--host", "0.0.0.0"])
    assert cfg.admin_api_key == ADMIN
    assert describe_config(cfg)["admin_api_key"] == "<set>" and ADMIN not in str(describe_config(cfg))
    assert RouterConfig.from_argv(["--host", "::1"]).host == "::1"


def test_post_workers_reports_no_network_details(setup: Setup):
    client = setup.client("open")
    answers = set()
    for url in ("http://127.0.0.1:9", "http://10.255.255.1:81", setup.urls[0] + "/nothing-here"):
        status, answer, _ = setup.call(client, "POST", "/workers", json={"url": url})
        answers.add((status, answer["error"]["message"]))
    assert len(answers) == 1, answers  # refused, timed out, not SGLang: one answer
    status, message = answers.pop()
    assert status == 400 and "did not answer as an SGLang worker" in message


def test_the_same_worker_under_another_url_is_refused(setup: Setup):
    client = setup.client("open")
    other = setup.urls[0].replace("127.0.0.1", "localhost")
    status, answer, _ = setup.call(client, "POST", "/workers", json={"url": other})
    assert status == 409 and "same instance id" in answer["error"]["message"], answer
    assert len(client.server.app[ROUTER].pool.workers) == 2


# -- suspects ------------------------------------------------------------------------------------------------
def test_suspect_list_expires_and_is_bounded():
    suspects = SuspectList(ttl_s=10, capacity=2)
    a, b, c = (SuspectList.fingerprint("/generate", x) for x in (b"a", b"b", b"c"))
    suspects.add(a, Suspect("r1", "w0", at=100.0))
    assert suspects.find(a, now=105.0).rid == "r1"
    assert suspects.find(SuspectList.fingerprint("/v1/score", b"a"), now=105.0) is None
    assert suspects.find(a, now=111.0) is None  # expired
    for key, t in ((a, 200.0), (b, 201.0), (c, 202.0)):
        suspects.add(key, Suspect("r", "w0", at=t))
    assert len(suspects) == 2 and suspects.find(a, now=203.0) is None


def test_a_suspect_is_cleared_by_a_run_alone_or_convicted_by_a_second_death():
    """Suspects are no longer refused: only one whose run alone killed a second worker is (``test_quarantine``)."""
    suspects = SuspectList(ttl_s=10)
    a, b = (SuspectList.fingerprint("/generate", x) for x in (b"a", b"b"))
    suspects.add(a, Suspect("r1", "w0", at=100.0))
    suspects.add(b, Suspect("r2", "w0", at=100.0))
    assert not suspects.find(a, now=101.0).poison
    suspects.clear(a)
    assert suspects.find(a, now=101.0) is None and suspects.cleared == 1
    poison = suspects.convict(b, "r3", "w1", now=105.0)
    assert (poison.poison, poison.worker_id, poison.first_worker_id) == (True, "w1", "w0")
    suspects.clear(b)  # poison stays poison
    suspects.add(b, Suspect("r4", "w2", at=106.0))
    assert suspects.find(b, now=114.0).poison  # the TTL runs from the conviction
    assert suspects.find(b, now=115.0) is None


def test_an_attempt_is_known_by_its_body_without_the_rid():
    """The router's ``rid`` goes into the bytes sent, not into the fingerprint: a client resending the same request
    (with its own ``rid``, or none) is the same suspect."""
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}
    made = Attempt.of("/generate", dict(body), {}, pass_authorization=False)
    sent = orjson.loads(made.body)
    assert sent["rid"] == made.abort_rid and made.abort_rid.startswith("sgl-moe-")
    assert {k: v for k, v in sent.items() if k != "rid"} == body
    given = Attempt.of("/generate", {**body, "rid": "mine"}, {}, pass_authorization=False)
    assert orjson.loads(given.body)["rid"] == given.abort_rid == "mine"
    plain = orjson.dumps(body)
    assert made.fingerprint == given.fingerprint == SuspectList.fingerprint("/generate", plain)
    assert SuspectList.fingerprint("/v1/score", plain) != made.fingerprint


def test_an_attempts_bytes_are_the_body_with_its_rid_appended():
    """``Attempt.of`` writes the body once, the ``rid`` last: the bytes the router sent when it appended the ``rid``
    to the body already written, for every shape of ``rid`` and body (a client's string or list, none, a batch, an
    empty body, ids written beforehand)."""
    def appended(body: dict, rid, ids_json: bytes | None) -> tuple[bytes, bytes]:  # the bytes before 2026-11-30
        data = orjson.dumps({**body, "input_ids": orjson.Fragment(ids_json)} if ids_json is not None else body)
        if rid is None:
            return data, data
        return data[:-1] + (b',"rid":' if len(data) > 2 else b'"rid":') + orjson.dumps(rid) + b"}", data

    ids = [5, 17, 300000, 2]
    cases = [({"text": "hi", "sampling_params": {"max_new_tokens": 1}}, None),
             ({"text": "hi", "rid": "mine"}, None),
             ({"text": ["a", "b"], "rid": ["r1", "r2"]}, None),
             ({"text": ["a", "b"]}, None),
             ({}, None),
             ({"rid": "only"}, None),
             ({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}, orjson.dumps(ids)),
             ({"input_ids": ids, "rid": 7}, orjson.dumps(ids))]
    for body, ids_json in cases:
        made = Attempt.of("/generate", dict(body), {}, pass_authorization=False, input_ids_json=ids_json)
        rid = body.get("rid", made.abort_rid)
        want, unnamed = appended({k: v for k, v in body.items() if k != "rid"}, rid, ids_json)
        assert made.body == want, body
        assert made.unnamed == unnamed, body
    score = Attempt.of("/v1/score", {"query": "q", "rid": "kept"}, {}, pass_authorization=False)
    assert score.body == score.unnamed == orjson.dumps({"query": "q", "rid": "kept"})  # not a rid route


# -- slow clients --------------------------------------------------------------------------------------------
def test_a_slow_request_head_is_cut_off(tmp_path: Path):
    """``python -m sgl_moe.router`` (no workers): a client that sends its request line and headers one byte at a time
    is disconnected after ``--header-timeout-s``; a body that does not arrive is answered 408."""
    import socket

    from sgl_moe.harness.router_process import RouterProcess

    with RouterProcess(log_path=tmp_path / "router.log", worker_urls=[],
                       args=["--header-timeout-s", "1.5", "--body-timeout-s", "1.5"]).start() as router:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((router.host, router.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, router.log_text()
                time.sleep(0.2)
        with socket.create_connection((router.host, router.port), timeout=10) as sock:
            t0 = time.monotonic()
            closed_after = None
            for ch in b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                try:
                    sock.sendall(bytes([ch]))
                    time.sleep(0.1)
                    sock.setblocking(False)
                    try:
                        if sock.recv(1) == b"":
                            closed_after = time.monotonic() - t0
                            break
                    except BlockingIOError:
                        pass
                    finally:
                        sock.setblocking(True)
                except OSError:
                    closed_after = time.monotonic() - t0
                    break
            assert closed_after is not None and 1.0 < closed_after < 5.0, closed_after
        with socket.create_connection((router.host, router.port), timeout=10) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"text\": ")
            t0 = time.monotonic()
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 5, answer[:200]


# -- health: busy is not dead ------------------------------------------------------------------------------------
class _Probe:
    """``Discovery.get`` stand-in: every probe fails with ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def get(self, url: str, timeout: float = 10.0):
        raise self.exc


class _Pool:
    def __init__(self, worker: Any) -> None:
        self.cfg = RouterConfig(health_failures=2, health_interval_s=1.0, health_stall_s=30.0)
        self.workers = {worker.id: worker}
        self.out: list[str] = []

    def mark_unhealthy(self, worker: Any, reason: str) -> None:
        worker.state = "unhealthy"
        self.out.append(reason)


def _health_worker(inflight: int, progress_age_s: float) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(id="w0", url="http://w0", state="healthy", health_failures=0, last_error=None,
                           inflight_requests=inflight, last_progress=time.monotonic() - progress_age_s)


@pytest.mark.parametrize(("inflight", "age", "exc", "out_after"), [
    (4, 10.0, TimeoutError(), None),  # busy: requests in flight, progress 10 s ago
    (4, 0.0, TimeoutError(), None),  # progress just now
    (0, 10.0, TimeoutError(), 2),  # idle and silent: out after --health-failures probes
    (4, 60.0, TimeoutError(), 2),  # in flight but stalled past --health-stall-s
    (4, 0.0, "refused", 1),  # the process is gone: out at once, busy or not
])
def test_health_tells_busy_from_dead(inflight: int, age: float, exc: Any, out_after: int | None):
    import aiohttp

    from sgl_moe.router.membership.health import HealthMonitor

    if exc == "refused":
        exc = aiohttp.ClientConnectorError(None, OSError(111, "Connection refused"))  # type: ignore[arg-type]
    worker = _health_worker(inflight, age)
    pool = _Pool(worker)
    monitor = HealthMonitor(pool, _Probe(exc))  # type: ignore[arg-type]
    out_at = None
    for probe in range(1, 4):
        asyncio.run(monitor.check(worker))
        if worker.state != "healthy":
            out_at = probe
            break
    assert out_at == out_after, (worker.state, pool.out)
