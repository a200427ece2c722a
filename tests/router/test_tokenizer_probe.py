"""The router checks its token ids against each joining worker's ``POST /v1/tokenize`` (``tokenizer_probe``).

A stand-in worker serves the shipped model's info and tokenizer files (with a ChatML template, so the chat
probe runs) and answers ``/v1/tokenize`` with the router's own ids, with one id changed, or with a 404.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sgl_moe import DEFAULT_MODEL_DIR, saturation, wire
from sgl_moe.flops import FlopsModel
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.service import ROUTER, build_app
from sgl_moe.router.membership.tokenizer_probe import (
    LONG_TEXT,
    PROBE_MESSAGES,
    PROBE_TEXTS,
    first_difference,
    probe_texts,
)
from sgl_moe.router.request.chat_prompt import chat_prompt
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.info import build_info

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHANGED_PROBE, CHANGED_AT = "cjk", 2


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    for f in DEFAULT_MODEL_DIR.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    cfg = json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def stand_in(tok_dir: Path, mode: str, received: list[dict]) -> web.Application:
    """``mode``: "same" (the router's ids), "changed" (one id changed on one probe) or "missing" (404)."""
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    flops = FlopsModel.from_hf_config(config)
    info = build_info(model_name=str(DEFAULT_MODEL_DIR), model_path=str(DEFAULT_MODEL_DIR),
                      tokenizer_path=str(tok_dir), hf_config=config, instance_id="stand-in", context_length=4096,
                      page_size=16, step_tokens=4096, dp_size=1, kv_events_config=None, prefix_caching=True,
                      device="none", sglang_version="stand-in", moe=MoeArgs(),
                      theta=saturation.without_transfer(flops.request_flops(0, 4096), 4096, 1.0))
    tok = RouterTokenizer.from_dir(tok_dir)
    names = {text: name for name, text in probe_texts(tok)}

    async def tokenize(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        if "messages" in body:
            return web.json_response({"tokens": chat_prompt(tok, body["messages"], {}, {})[0]})
        assert body["add_special_tokens"] is True
        out = tok.encode_batch(body["prompt"])
        for text, ids in zip(body["prompt"], out, strict=True):
            if mode == "changed" and names.get(text) == CHANGED_PROBE:
                ids[CHANGED_AT] += 1
        return web.json_response({"tokens": out, "count": [len(i) for i in out], "max_model_len": 4096})

    async def generate(request: web.Request) -> web.Response:
        received.append(orjson.loads(await request.read()))
        return web.json_response({"text": "x", "output_ids": [5], "meta_info": {"prompt_tokens": 1}})

    async def score(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        received.append(body)
        lps = [[-1.0 - k for k, _ in enumerate(labels)] for labels in body["label_token_ids"]]
        top = [[0.5 ** (k + 1) for k, _ in enumerate(labels)] for labels in body["label_token_ids"]]
        return web.json_response({"scores": top, "token_logprobs": lps, "object": "scoring"})

    async def get_info(request: web.Request) -> web.Response:
        return web.Response(body=wire.encode(info), content_type="application/json")

    async def tokenizer_file(request: web.Request) -> web.Response:
        path = tok_dir / request.match_info["name"]
        if not path.is_file():
            raise web.HTTPNotFound()
        return web.Response(body=path.read_bytes())

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get(wire.INFO_PATH, get_info)
    app.router.add_get("/sgl_moe/tokenizer/{name:.+}", tokenizer_file)
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/score", score)
    if mode != "missing":
        app.router.add_post("/v1/tokenize", tokenize)
    return app


async def scenario(tok_dir: Path, mode: str, classify: list[dict] | None = None) -> dict[str, Any]:
    received: list[dict] = []
    worker = TestServer(stand_in(tok_dir, mode, received))
    await worker.start_server()
    client = TestClient(TestServer(build_app(RouterConfig(worker_urls=(str(worker.make_url("")).rstrip("/"),),
                                                          prefix_wait_s=0))))
    await client.start_server()
    try:
        router = client.server.app[ROUTER]
        deadline = time.monotonic() + 60  # the first tokenizer load imports transformers
        while not router.pool.workers:
            assert time.monotonic() < deadline, "the stand-in did not join"
            await asyncio.sleep(0.01)
        listing = await (await client.get("/workers")).json()
        gen = await client.post("/generate", json={"text": "Hello there", "sampling_params": {"max_new_tokens": 1}})
        metrics = await (await client.get("/metrics")).text()
        answers = []
        for body in classify or []:
            r = await client.post("/v1/classify", json=body)
            answers.append((r.status, await r.json()))
        return {"check": listing["workers"][0]["tokenizer_check"], "exact": router.pool.tokenizer.exact,
                "generate_status": gen.status, "received": received, "metrics": metrics, "classify": answers}
    finally:
        await client.close()
        await worker.close()


def mismatches(metrics: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith("sgl_moe_router_tokenizer_mismatches_total "))
    return float(line.split()[1])


def test_equal_ids_keep_affinity(tok_dir: Path) -> None:
    got = asyncio.run(scenario(tok_dir, "same"))
    n_texts = len(probe_texts(RouterTokenizer.from_dir(tok_dir)))
    assert got["check"] == {"state": "match", "probes": n_texts + 1, "first_difference": None, "detail": ""}
    assert got["exact"] is True
    assert mismatches(got["metrics"]) == 0
    assert got["generate_status"] == 200 and "input_ids" in got["received"][0]


def test_one_changed_id_names_the_probe_and_turns_affinity_off(tok_dir: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="sgl_moe.router"):
        got = asyncio.run(scenario(tok_dir, "changed"))
    diff = got["check"]["first_difference"]
    assert got["check"]["state"] == "mismatch"
    assert (diff["probe"], diff["position"], diff["worker_id"] - diff["router_id"]) == (CHANGED_PROBE, CHANGED_AT, 1)
    assert got["exact"] is False
    assert mismatches(got["metrics"]) == 1
    assert got["generate_status"] == 200
    assert got["received"][0]["text"] == "Hello there" and "input_ids" not in got["received"][0]
    probe_lines = [r for r in caplog.records if "/v1/tokenize" in r.getMessage()]
    assert len(probe_lines) == 1 and f"{CHANGED_PROBE!r} at position {CHANGED_AT}" in probe_lines[0].getMessage()


def test_a_worker_without_tokenize_is_unavailable_and_stays_exact(tok_dir: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="sgl_moe.router"):
        got = asyncio.run(scenario(tok_dir, "missing"))
    assert got["check"]["state"] == "unavailable" and "404" in got["check"]["detail"]
    assert got["exact"] is True
    assert mismatches(got["metrics"]) == 0
    assert got["generate_status"] == 200
    assert [r.getMessage() for r in caplog.records if "verify" in r.getMessage()][0].endswith("exact as loaded")


def test_first_difference_covers_a_shorter_list() -> None:
    assert first_difference("p", [1, 2], [1, 2]) is None
    assert first_difference("p", [1, 2], [1, 2, 3]) == {"probe": "p", "position": 2, "router_id": None,
                                                         "worker_id": 3, "router_len": 2, "worker_len": 3}


def test_the_probe_set_covers_what_the_issue_lists() -> None:
    assert 1800 <= len(LONG_TEXT.split()) <= 2600
    assert {"cjk", "emoji", "accents", "whitespace", "code", "long"} <= {n for n, _ in PROBE_TEXTS}
    assert PROBE_MESSAGES[-1]["role"] == "user"


def test_classify_sends_text_to_score_when_the_router_tokenizer_is_not_exact(tok_dir: Path) -> None:
    """After a mismatch the router cannot build the worker's ids, so ``/v1/classify`` sends the prompt (or the
    rendered chat) as text and lets the worker tokenize it, instead of answering 501 itself."""
    tok = RouterTokenizer.from_dir(tok_dir)
    one, other, multi = " the", " no", " absolutely"
    assert len(tok.encode_plain(one)) == len(tok.encode_plain(other)) == 1 < len(tok.encode_plain(multi))
    bodies = [{"prompt": "Is this good?", "labels": [one, other]},
              {"prompt": "Pick one.", "labels": [multi, other]},
              {"messages": [{"role": "user", "content": "Good?"}], "labels": [one, other]},
              {"input_ids": [5, 6, 7], "labels": [one, other]}]
    got = asyncio.run(scenario(tok_dir, "changed", bodies))
    assert got["exact"] is False
    assert [status for status, _ in got["classify"]] == [200] * len(bodies), got["classify"]
    assert all(answer["results"][0]["label"] in (one, other, multi) for _, answer in got["classify"])
    scores = [b for b in got["received"] if "items" in b]
    assert scores[0]["query"] == "Is this good?" and scores[0]["items"] == [""]
    assert scores[0]["label_token_ids"] == [tok.encode_plain(one) + tok.encode_plain(other)]
    first = tok.encode_plain(multi)[0]
    # a label's later tokens follow its prefix, written back as text
    assert scores[1]["query"] == "Pick one." and scores[1]["items"][:2] == ["", tok.decode([first])]
    assert scores[2]["query"] == "<|im_start|>user\nGood?<|im_end|>\n<|im_start|>assistant\n"
    assert scores[3]["query"] == [5, 6, 7]  # the client's own ids go as they are
