"""The worker's own guard against requests that would take SGLang 0.5.23 down, for clients that skip the router.

SGLang checks neither token ids against the vocabulary (an id past the embedding table raises ``IndexError``
in the scheduler) nor, on the CPU MoE path, empty prompts (``cannot reshape tensor of 0 elements``); either
kills the whole server. This ASGI middleware reads the body of the inference routes, answers such requests
400 in SGLang's error shape, and passes everything else on unchanged (the body replayed, later messages —
the client's disconnect — from the real channel, so SGLang still aborts requests whose client left).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("sgl_moe.worker")

GUARDED = frozenset({"/generate", "/v1/completions", "/v1/chat/completions", "/v1/score"})
ID_FIELDS = ("input_ids", "token_ids_logprob", "label_token_ids")
"""Fields holding token ids (a list, or a list of lists)."""
MAX_GUARDED_BODY = 512 * 2**20
"""Bodies larger than this are passed on unchecked (SGLang's own limits apply)."""


def _ids(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return []
    return [t for v in value for t in v] if value and all(isinstance(v, list) for v in value) else value


def problem(path: str, body: Any, vocab_size: int) -> str | None:
    """Why SGLang would crash on ``body`` sent to ``path``, or None."""
    if not isinstance(body, dict):
        return None
    texts = [body.get("text"), body.get("prompt")]
    for t in texts:
        if t == "" or (isinstance(t, list) and any(x == "" for x in t)):
            return "the prompt is empty"
    for name in ("input_ids", "prompt"):
        value = body.get(name)
        if isinstance(value, list) and (not value or any(isinstance(v, list) and not v for v in value)):
            return f"{name} is empty"
    candidates = [*(_ids(body.get(n)) for n in ID_FIELDS), _ids(body.get("prompt"))]
    if path == "/v1/score":
        candidates += [_ids(body.get("items")), _ids(body.get("query"))]
    for ids in candidates:
        for t in ids:
            if isinstance(t, int) and not isinstance(t, bool) and not 0 <= t < vocab_size:
                return f"token id {t} is outside the model's vocabulary (ids 0..{vocab_size - 1})"
    return None


class InputGuard:
    """ASGI middleware: 400 for the inputs ``problem`` names on ``GUARDED`` routes."""

    def __init__(self, app: Any, vocab_size: int) -> None:
        self.app = app
        self.vocab_size = vocab_size
        self.refused = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GUARDED:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if not message.get("more_body") or size > MAX_GUARDED_BODY:
                break
        body = b"".join(chunks)
        more = bool(message.get("more_body"))
        reason = None
        if not more:
            try:
                reason = problem(scope["path"], json.loads(body), self.vocab_size)
            except (ValueError, RecursionError):
                reason = None  # not JSON: SGLang answers it
        if reason is not None:
            self.refused += 1
            log.warning("refused %s: %s", scope["path"], reason)
            payload = json.dumps({"object": "error", "message": reason, "type": "BadRequestError",
                                  "param": None, "code": 400}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        await self.app(scope, replay, send)


def install(app: Any, model_path: str) -> bool:
    """Add the guard to SGLang's FastAPI ``app`` (before it starts) when the model's vocabulary size is known."""
    config = Path(model_path).expanduser() / "config.json"
    try:
        cfg = json.loads(config.read_text())
        vocab = int(cfg.get("text_config", cfg).get("vocab_size") or 0)
    except (OSError, ValueError, AttributeError):
        vocab = 0
    if vocab <= 0:
        log.warning("no vocabulary size in %s: the worker cannot refuse out-of-vocabulary token ids itself", config)
        return False
    app.add_middleware(InputGuard, vocab_size=vocab)
    return True
