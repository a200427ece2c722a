"""The worker's own guard (``sgl_moe.worker.input_guard``): what it refuses, and that it passes the rest through
unchanged, body and disconnect included. Against real SGLang workers: ``tests/live/test_hardening_live.py``."""

from __future__ import annotations

import asyncio
import json

import pytest

from sgl_moe.worker.input_guard import InputGuard, problem

VOCAB = 100


@pytest.mark.parametrize(("path", "body"), [
    ("/generate", {"text": ""}), ("/generate", {"text": ["a", ""]}), ("/generate", {"input_ids": []}),
    ("/generate", {"input_ids": [[1], []]}), ("/generate", {"input_ids": [1, VOCAB]}),
    ("/generate", {"input_ids": [[1], [-1]]}), ("/generate", {"input_ids": [1], "token_ids_logprob": [VOCAB]}),
    ("/v1/completions", {"prompt": ""}), ("/v1/completions", {"prompt": [5, 10**9]}),
    ("/v1/score", {"query": [1], "items": [[2], [VOCAB]]}), ("/v1/score", {"items": ["a"], "label_token_ids": [VOCAB]}),
])
def test_refused(path, body):
    assert problem(path, body, VOCAB) is not None


@pytest.mark.parametrize(("path", "body"), [
    ("/generate", {"text": "hi"}), ("/generate", {"input_ids": [[0], [VOCAB - 1]]}),
    ("/v1/completions", {"prompt": ["a", "b"]}), ("/v1/score", {"query": "q", "items": ["x"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}), ("/generate", [1, 2]),
])
def test_passed(path, body):
    assert problem(path, body, VOCAB) is None


def run_guard(path: str, chunks: list[bytes], then: list[dict]) -> tuple[list[dict], list[dict]]:
    """Drive the middleware with body ``chunks`` and later messages ``then``; what the app got, what was sent."""
    got: list[dict] = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            got.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        if then:
            got.append(await receive())

    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    incoming += then

    async def receive():
        return incoming.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path}
    asyncio.run(InputGuard(app, VOCAB)(scope, receive, send))
    return got, sent


def test_the_body_reaches_the_app_whole_and_the_disconnect_after_it():
    body = json.dumps({"input_ids": [1, 2, 3]}).encode()
    got, sent = run_guard("/generate", [body[:5], body[5:]], [{"type": "http.disconnect"}])
    assert sent == []
    assert got[0] == {"type": "http.request", "body": body, "more_body": False}
    assert got[1] == {"type": "http.disconnect"}


def test_a_refusal_is_400_json_and_the_app_never_runs():
    got, sent = run_guard("/generate", [json.dumps({"input_ids": [VOCAB]}).encode()], [])
    assert got == []
    assert sent[0]["status"] == 400 and "vocabulary" in json.loads(sent[1]["body"])["message"]
