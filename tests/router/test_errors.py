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


def test_an_exception_escaping_a_handler_answers_json_500_and_http_exceptions_keep_their_status():
    async def main() -> list[tuple[int, dict]]:
        async def broken(request: web.Request) -> web.Response:
            return [][0]  # a router bug

        async def refused(request: web.Request) -> web.Response:
            raise web.HTTPUnsupportedMediaType(text="send JSON")

        app = web.Application(middlewares=[json_errors])
        app.router.add_post("/broken", broken)
        app.router.add_post("/refused", refused)
        async with TestClient(TestServer(app)) as client:
            out = []
            for path in ("/broken", "/refused"):
                resp = await client.post(path)
                assert resp.content_type == "application/json"
                out.append((resp.status, await resp.json()))
            return out

    (s500, b500), (s415, b415) = asyncio.run(main())
    assert s500 == 500 and b500["error"]["type"] == "internal_error" and "IndexError" in b500["error"]["message"]
    assert list(b500["error"]) == ["message", "type", "param", "code"] and b500["error"]["code"] == 500
    assert s415 == 415 and b415["error"] == {"message": "send JSON", "type": "invalid_request_error", "param": None,
                                             "code": 415}
