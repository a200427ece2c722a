"""errors: every router-made error has one JSON shape, whichever route or exception produced it."""

import asyncio

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sgl_moe.router.errors import RequestError, error_body, error_response, json_errors, request_error_response


def test_error_response_shape_and_headers():
    resp = error_response(429, "router busy", kind="rate_limit_exceeded", headers={"Retry-After": "3"})
    assert resp.status == 429 and resp.content_type == "application/json" and resp.headers["Retry-After"] == "3"
    assert resp.body == orjson.dumps({"error": {"message": "router busy", "type": "rate_limit_exceeded",
                                                "param": None, "code": 429}})  # key order is part of the bytes


def test_error_body_is_the_object_inside_error():
    assert list(error_body(502, "x", kind="request_failed")) == ["message", "type", "param", "code"]


def test_request_error_kind_follows_status():
    bad = orjson.loads(request_error_response(RequestError(400, "max_tokens must be positive", "max_tokens")).body)
    assert bad == {"error": {"message": "max_tokens must be positive", "type": "invalid_request_error",
                             "param": "max_tokens", "code": 400}}
    missing = orjson.loads(request_error_response(RequestError(404, "no such model", "model")).body)
    assert missing["error"]["type"] == "not_found_error" and missing["error"]["code"] == 404


def test_unknown_paths_and_methods_answer_json():
    async def main() -> list[tuple[int, dict]]:
        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application(middlewares=[json_errors])
        app.router.add_get("/health", health)
        async with TestClient(TestServer(app)) as client:
            out = []
            for method, path in (("GET", "/nowhere"), ("POST", "/health")):
                resp = await client.request(method, path)
                out.append((resp.status, await resp.json()))
            return out

    (s404, b404), (s405, b405) = asyncio.run(main())
    assert s404 == 404 and b404["error"]["type"] == "not_found_error" and "/nowhere" in b404["error"]["message"]
    assert s405 == 405 and b405["error"]["type"] == "invalid_request_error" and "GET" in b405["error"]["message"]
