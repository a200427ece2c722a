"""Workers that die under requests (``suspects``, ``quarantine``), and clients that leave (aborts), in-process.

Stand-in workers (``doubles.stand_in``) behind a fault middleware: each request is held ``delay_s`` so that
several are in flight at once; a worker is *killed* by closing its listening socket and every connection it
holds (what the router sees when SGLang's process dies), either by the test (an out-of-memory kill: every request
in flight is innocent) or by the poison token reaching it. Every request's start and end on each worker is
recorded, so the tests can check which ran together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import ClientTimeout, web
from aiohttp.test_utils import TestClient, TestServer
from doubles.stand_in import StandIn, tokenizer_dir

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.service import ROUTER, Router, build_app

POISON, HANG = 4000, 4001
"""Token ids that kill whichever worker prefills them, or keep it busy with them for an hour."""


@dataclass
class Run:
    marker: int
    worker: int
    start: float
    end: float | None = None


@dataclass
class FaultyWorker:
    """A stand-in that holds each inference request ``delay_s`` and can die."""

    index: int
    stand_in: StandIn
    runs: list[Run]
    delay_s: float = 0.3
    server: TestServer | None = None
    dead: bool = False
    _open: set[Any] = field(default_factory=set)

    def app(self) -> web.Application:
        app = self.stand_in.app()

        @web.middleware
        async def faults(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
            if self.dead:
                request.transport.close()
                raise web.HTTPServiceUnavailable()
            if request.path not in ("/generate", "/v1/score"):
                return await handler(request)
            body = orjson.loads(await request.read())
            ids = body.get("input_ids") or []
            run = Run(ids[-1] if ids else -1, self.index, time.monotonic())
            self.runs.append(run)
            self._open.add(request.transport)
            try:
                if POISON in ids:
                    self.kill()
                    await asyncio.sleep(3600)
                await asyncio.sleep(3600 if HANG in ids else self.delay_s)
                return await handler(request)
            finally:
                run.end = time.monotonic()
                self._open.discard(request.transport)

        app.middlewares.append(faults)  # the stand-in's /abort_request records aborts (and hangs, when told)
        return app

    def kill(self) -> None:
        """The process is gone: connections refused, those open dropped."""
        self.dead = True
        for site in list(self.server.runner.sites):
            asyncio.get_running_loop().create_task(site.stop())
        for transport in list(self._open):
            transport.close()


class Cluster:
    def __init__(self, tok: Path, n: int, **settings: Any) -> None:
        self.tok, self.n, self.settings = tok, n, settings
        self.runs: list[Run] = []
        self.workers = [FaultyWorker(i, StandIn(tok), self.runs) for i in range(n)]

    async def __aenter__(self) -> Cluster:
        for w in self.workers:
            w.server = TestServer(w.app())
            await w.server.start_server()
        urls = tuple(str(w.server.make_url("")).rstrip("/") for w in self.workers)
        cfg = RouterConfig(worker_urls=urls, prefix_wait_s=0, health_interval_s=0.5, **self.settings)
        self.client = TestClient(TestServer(build_app(cfg)))
        await self.client.start_server()
        self.router: Router = self.client.server.app[ROUTER]
        deadline = time.monotonic() + 60
        while not (len(self.router.pool.workers) == self.n and self.router.pool.tokenizer is not None):
            assert time.monotonic() < deadline, "stand-ins did not join"
            await asyncio.sleep(0.02)
        self.ids = {w.url: int(w.id[1:]) for w in self.router.pool.workers.values()}
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        for w in self.workers:
            await w.server.close()

    async def generate(self, marker: int, *tokens: int, **extra: Any) -> tuple[int, dict]:
        body = {"input_ids": [1, 2, *tokens, marker], "sampling_params": {"max_new_tokens": 1}, **extra}
        async with self.client.post("/generate", json=body) as r:
            return r.status, await r.json()

    def runs_of(self, marker: int) -> list[Run]:
        return [r for r in self.runs if r.marker == marker]

    def overlapping(self, run: Run) -> list[Run]:
        """Other requests that were on ``run``'s worker at any moment of it."""
        end = run.end if run.end is not None else time.monotonic()
        return [r for r in self.runs if r is not run and r.worker == run.worker
                and r.start < end and (r.end is None or r.end > run.start)]

    def counter(self, name: str) -> float:
        text = self.router.metrics.render().decode()
        return float(next(x for x in text.splitlines() if x.startswith(f"sgl_moe_router_{name}_total ")).split()[1])


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokenizer_dir(tmp_path_factory.mktemp("tok"), template=False)


def test_innocent_suspects_of_a_killed_worker_are_answered_alone_one_at_a_time(tok: Path):
    """A worker lost to something else (an OOM kill): every request in flight on it is a suspect, is retried by the
    router itself (the clients just wait), alone on the surviving worker and one at a time, and is answered."""

    async def scenario() -> None:
        async with Cluster(tok, 2) as c:
            markers = list(range(100, 106))
            calls = [asyncio.ensure_future(c.generate(m)) for m in markers]
            await asyncio.sleep(0.15)  # all six in flight, three on each worker
            killed = c.workers[0]
            on_killed = {r.marker for r in c.runs if r.worker == killed.index}
            assert on_killed and len(on_killed) < len(markers)
            killed.kill()
            background = [asyncio.ensure_future(c.generate(m)) for m in range(200, 204)]  # ordinary traffic
            answers = await asyncio.gather(*calls, *background)
            assert [s for s, _ in answers] == [200] * len(answers), answers
            lane_runs = [r for m in on_killed for r in c.runs_of(m) if r.worker != killed.index]
            assert len(lane_runs) == len(on_killed)
            for run in lane_runs:
                assert c.overlapping(run) == [], (run, c.overlapping(run))  # alone on its worker
            spans = sorted((r.start, r.end) for r in lane_runs)
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))  # one at a time
            assert c.counter("suspects_cleared") == len(on_killed) and c.counter("poison_convicted") == 0
            status, _ = await c.generate(min(on_killed))  # sent again: an ordinary request now
            assert status == 200 and len(c.router.suspects) == 0

    asyncio.run(scenario())


def test_the_request_that_kills_the_worker_it_runs_alone_on_is_poison_and_refused(tok: Path):
    async def scenario() -> None:
        async with Cluster(tok, 3) as c:
            calls = [asyncio.ensure_future(c.generate(m)) for m in (300, 301, 302, 303)]
            await asyncio.sleep(0.1)
            poison = asyncio.ensure_future(c.generate(399, POISON))
            answers = await asyncio.gather(*calls)
            status, answer = await poison
            assert [s for s, _ in answers] == [200] * 4, answers  # innocent, on the first dead worker or not
            assert status == 400, answer
            message = answer["error"]["message"]
            assert "ran alone on worker" in message and "died too" in message and "--suspect-ttl-s" in message
            assert sum(w.dead for w in c.workers) == 2  # the one it was placed on, and the one it ran alone on
            [second] = [r for r in c.runs_of(399)][1:]
            assert c.overlapping(second) == []
            assert c.counter("poison_convicted") == 1
            before = len(c.runs)
            status, answer = await c.generate(399, POISON)  # sent again: refused before any worker sees it
            assert status == 400 and "died too" in answer["error"]["message"] and len(c.runs) == before
            assert c.counter("suspect_refusals") == 1
            assert (await c.generate(304))[0] == 200  # the last worker serves on

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", ["accept", "hang"])
def test_a_client_that_leaves_has_its_load_held_until_the_abort_is_answered_or_times_out(
        tok: Path, mode: str, caplog: pytest.LogCaptureFixture):
    """The worker's load stays counted while its abort is pending (a worker too busy to take the abort is still
    running the request) and is released whatever the abort does; a failed abort is logged with its reason (never
    an empty one) and counted."""

    async def scenario() -> tuple[list[int], list[str], float]:
        async with Cluster(tok, 1, abort_timeout_s=0.5) as c:
            worker = c.workers[0]
            worker.stand_in.abort_hangs = mode == "hang"
            w = next(iter(c.router.pool.workers.values()))
            body = {"input_ids": [1, 2, HANG], "sampling_params": {"max_new_tokens": 1}}
            with pytest.raises(TimeoutError):
                async with c.client.post("/generate", json=body, timeout=ClientTimeout(total=0.3)):
                    pass
            seen = []
            for _ in range(10):
                seen.append(w.inflight_requests)
                await asyncio.sleep(0.1)
            return seen, worker.stand_in.aborted, c.counter("abort_failures")

    with caplog.at_level("WARNING", logger="sgl_moe.router"):
        seen, aborted, failures = asyncio.run(scenario())
    assert len(aborted) == 1 and aborted[0].startswith("sgl-moe-")
    assert seen[-1] == 0  # released either way
    failed = [r.getMessage() for r in caplog.records if "abort of" in r.getMessage()]
    if mode == "hang":
        assert seen[0] == 1 and failures == 1  # held while the abort was pending, then released
        assert len(failed) == 1 and "failed after" in failed[0] and "TimeoutError()" in failed[0], failed
    else:
        assert failures == 0 and failed == []
