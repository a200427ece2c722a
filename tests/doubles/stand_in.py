"""A stand-in worker for router tests: serves the shipped model's ``/sgl_moe/info`` and tokenizer files, answers
every inference route at once, and records what it received. Each instance has its own instance id."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web

from sgl_moe import DEFAULT_MODEL_DIR, saturation, wire
from sgl_moe.flops import FlopsModel
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.info import build_info

PAGE = 16
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokenizer_dir(folder: Path, template: bool) -> Path:
    """The shipped model's tokenizer files (no weights), its tokenizer config with or without a chat template."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in DEFAULT_MODEL_DIR.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    cfg = json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    if template:
        cfg["chat_template"] = CHATML
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@dataclass
class StandIn:
    """A worker that answers at once and records what it was sent; its tokenizer files come from ``tok_dir``."""

    tok_dir: Path
    received: list[tuple[str, dict]] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)
    """The ``Authorization`` header of each request in ``received``."""
    instance_id: str = field(default_factory=lambda: f"stand-in-{uuid.uuid4().hex[:8]}")
    fail_status: int | None = None
    """Answer every inference request with this status (a worker that fails requests but stays up)."""
    delay_s: float = 0.0
    """Wait this long before answering an inference request (one a client may leave meanwhile)."""
    aborted: list[str] = field(default_factory=list)
    """The ``rid`` of each ``/abort_request`` received."""
    abort_hangs: bool = False
    """``/abort_request`` never answers (a worker too busy to take an abort) instead of answering at once."""

    def app(self) -> web.Application:
        config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
        flops = FlopsModel.from_hf_config(config)
        info = build_info(model_name=str(DEFAULT_MODEL_DIR), model_path=str(DEFAULT_MODEL_DIR),
                          tokenizer_path=str(self.tok_dir), hf_config=config, instance_id=self.instance_id,
                          context_length=4096, page_size=PAGE, step_tokens=4096, dp_size=1, kv_events_config=None,
                          prefix_caching=True, device="none", sglang_version="stand-in", moe=MoeArgs(),
                          theta=saturation.without_transfer(flops.request_flops(0, 4096), 4096, 1.0))

        async def serve(request: web.Request) -> web.StreamResponse:
            body = orjson.loads(await request.read())
            self.received.append((request.path, body))
            self.authorization.append(request.headers.get("Authorization"))
            if self.fail_status is not None:
                return web.json_response({"error": "stand-in told to fail"}, status=self.fail_status)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if body.get("stream"):
                out = web.StreamResponse(headers={"content-type": "text/event-stream"})
                await out.prepare(request)
                for chunk in (b'data: {"text": "x"}\n\n', b"data: [DONE]\n\n"):
                    await out.write(chunk)
                await out.write_eof()
                return out
            one = {"text": "x", "output_ids": [5], "meta_info": {"prompt_tokens": 1, "cached_tokens": 0}}
            prompt = body.get("input_ids") or body.get("text")
            batch = request.path == "/generate" and isinstance(prompt, list) and isinstance(prompt[0], (list, str))
            return web.json_response([one] * len(prompt) if batch else one)

        async def get_info(request: web.Request) -> web.Response:
            return web.Response(body=wire.encode(info), content_type="application/json")

        async def tokenizer_file(request: web.Request) -> web.Response:
            # Every path a worker serves its tokenizer files under: /sgl_moe/tokenizer.json,
            # /sgl_moe/tokenizer_config.json and /sgl_moe/tokenizer/{name}.
            name = request.match_info.get("name") or request.path.rsplit("/", 1)[1]
            path = self.tok_dir / name
            if ".." in name or not path.is_file():
                raise web.HTTPNotFound()
            return web.Response(body=path.read_bytes(), content_type="application/octet-stream")

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def abort(request: web.Request) -> web.Response:
            self.aborted.append(orjson.loads(await request.read())["rid"])
            if self.abort_hangs:
                await asyncio.sleep(3600)
            return web.Response(text="")

        app = web.Application()
        app.router.add_get(wire.INFO_PATH, get_info)
        app.router.add_get(wire.TOKENIZER_PATH, tokenizer_file)
        app.router.add_get(wire.TOKENIZER_CONFIG_PATH, tokenizer_file)
        app.router.add_get("/sgl_moe/tokenizer/{name:.+}", tokenizer_file)
        app.router.add_get("/health", health)
        app.router.add_post("/abort_request", abort)
        for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/score", "/v1/decisions"):
            app.router.add_post(path, serve)
        return app


class ThreadServers:
    """aiohttp apps served from one background event loop (the router under test is a subprocess)."""

    def __init__(self, apps: list[web.Application]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []
        self.urls = asyncio.run_coroutine_threadsafe(self._start(apps), self.loop).result(60)

    async def _start(self, apps: list[web.Application]) -> list[str]:
        urls = []
        for app in apps:
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.runners.append(runner)
            urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
        return urls

    def stop(self) -> None:
        async def stop() -> None:
            for runner in self.runners:
                await runner.cleanup()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
