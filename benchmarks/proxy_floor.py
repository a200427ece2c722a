"""The CPU a Python proxy spends per request on HTTP alone, by server and client stack (the router's floor).

    .venv/bin/python benchmarks/proxy_floor.py [--requests 4000] [--concurrency 32] [--repeats 2]

A proxy that does nothing but forward each ``POST /generate`` body to one backend and relay the answer, built
four ways: aiohttp's server and client (what the router used before d9b7e0d), aiohttp's server and the router's
own ``WorkerClient`` (asyncio protocols + httptools; what it uses now), uvicorn serving a bare ASGI app with
``WorkerClient``, and bare asyncio protocols with httptools on both sides. The backend answers at once from a
bare protocol; the load comes from another process (aiohttp client, closed loop). Each proxy is a fresh process
on uvloop; CPU = its user + system time over the measured requests, after a warm-up, printed with its split (user,
kernel). The order of the four is the same in every repeat; compare the repeats to see the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time

import psutil
import uvloop

ANSWER = json.dumps({"text": "", "meta_info": {"id": "x", "prompt_tokens": 200, "cached_tokens": 0,
                                               "completion_tokens": 1}}).encode()
BODY = json.dumps({"text": "word " * 400, "sampling_params": {"max_new_tokens": 1}}).encode()


def backend(port: int) -> None:
    import httptools

    class Answer(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.parser = transport, httptools.HttpRequestParser(self)

        def data_received(self, data):
            self.parser.feed_data(data)

        def on_message_complete(self):
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                 % len(ANSWER) + ANSWER)

    async def main():
        await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", port)
        await asyncio.Event().wait()

    uvloop.run(main())


def _worker_client():
    from sgl_moe.router.front.worker_client import WorkerClient

    return WorkerClient(total_timeout_s=60, connect_timeout_s=10, keepalive_s=30)


def aiohttp_both(port: int, backend_url: str) -> None:
    from aiohttp import ClientSession, TCPConnector, web

    async def start(app):
        app["session"] = ClientSession(connector=TCPConnector(limit=0))

    async def handle(request):
        body = await request.read()
        async with request.app["session"].post(backend_url, data=body,
                                               headers={"content-type": "application/json"}) as resp:
            data = await resp.read()
        return web.Response(body=data, status=resp.status, content_type="application/json")

    app = web.Application()
    app.on_startup.append(start)
    app.router.add_post("/generate", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=uvloop.new_event_loop())


def aiohttp_server_worker_client(port: int, backend_url: str) -> None:
    from aiohttp import web

    client = None

    async def handle(request):
        nonlocal client
        client = client or _worker_client()
        body = await request.read()
        async with client.post(backend_url, body, {"content-type": "application/json"}) as resp:
            data = await resp.read()
        return web.Response(body=data, status=resp.status, content_type="application/json")

    app = web.Application()
    app.router.add_post("/generate", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=uvloop.new_event_loop())


def uvicorn_worker_client(port: int, backend_url: str) -> None:
    import uvicorn

    client = None

    async def app(scope, receive, send):
        nonlocal client
        if scope["type"] != "http":
            return
        client = client or _worker_client()
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        async with client.post(backend_url, b"".join(parts), {"content-type": "application/json"}) as resp:
            data = await resp.read()
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]})
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="error",
                access_log=False, lifespan="off")


def bare_protocols(port: int, backend_url: str) -> None:
    import httptools

    client = None

    class Front(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.parser, self.parts = transport, httptools.HttpRequestParser(self), []

        def data_received(self, data):
            self.parser.feed_data(data)

        def on_body(self, body):
            self.parts.append(body)

        def on_message_complete(self):
            body, self.parts = b"".join(self.parts), []
            asyncio.get_running_loop().create_task(self.relay(body))

        async def relay(self, body):
            nonlocal client
            client = client or _worker_client()
            async with client.post(backend_url, body, {"content-type": "application/json"}) as resp:
                data = await resp.read()
            self.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                 % (resp.status, len(data)) + data)

    async def main():
        await asyncio.get_running_loop().create_server(Front, "127.0.0.1", port)
        await asyncio.Event().wait()

    uvloop.run(main())


PROXIES = {"aiohttp server + aiohttp client": aiohttp_both,
           "aiohttp server + WorkerClient": aiohttp_server_worker_client,
           "uvicorn (bare ASGI) + WorkerClient": uvicorn_worker_client,
           "bare protocols + WorkerClient": bare_protocols}


def load(url: str, n: int, concurrency: int, out) -> None:
    from aiohttp import ClientSession, TCPConnector

    async def main():
        left = [n]
        async with ClientSession(connector=TCPConnector(limit=0)) as session:
            async def one_client():
                while left[0] > 0:
                    left[0] -= 1
                    async with session.post(url, data=BODY, headers={"content-type": "application/json"}) as r:
                        await r.read()
                        if r.status != 200:
                            raise RuntimeError(f"proxy answered {r.status}")
            t0 = time.perf_counter()
            await asyncio.gather(*(one_client() for _ in range(concurrency)))
            out.put(time.perf_counter() - t0)

    uvloop.run(main())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    import socket

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:.0f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    if min(args.requests, args.concurrency, args.repeats) < 1 or args.warmup < 0:
        p.error("--requests, --concurrency and --repeats must be positive, --warmup at least 0")
    ctx = multiprocessing.get_context("spawn")
    back_port = _free_port()
    back = ctx.Process(target=backend, args=(back_port,), daemon=True)
    back.start()
    _wait_listening(back_port)
    backend_url = f"http://127.0.0.1:{back_port}/generate"
    print(f"{args.requests} requests of {len(BODY)} bytes, {args.concurrency} in flight, after {args.warmup} "
          "warm-up; CPU of the proxy process per request")
    try:
        for rep in range(args.repeats):
            for name, serve in PROXIES.items():
                port = _free_port()
                proxy = ctx.Process(target=serve, args=(port, backend_url), daemon=True)
                proxy.start()
                try:
                    _wait_listening(port)
                    url = f"http://127.0.0.1:{port}/generate"
                    took = ctx.Queue()
                    for n in (args.warmup, args.requests):
                        proc = psutil.Process(proxy.pid)
                        t0 = proc.cpu_times()
                        loader = ctx.Process(target=load, args=(url, n, args.concurrency, took))
                        loader.start()
                        loader.join()
                        if loader.exitcode != 0:
                            raise RuntimeError(f"the load generator failed against {name}")
                        t1 = proc.cpu_times()
                        user, system = t1.user - t0.user, t1.system - t0.system
                        seconds = took.get()
                    per = args.requests / 1e3
                    print(f"repeat {rep + 1}  {name:36s} {(user + system) / per:6.3f} ms CPU/request (user "
                          f"{user / per:.3f}, kernel {system / per:.3f})  {args.requests / seconds:7.0f} req/s",
                          flush=True)
                finally:
                    proxy.kill()
                    proxy.join()
    finally:
        back.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
