"""Send the stream through one router with a fixed number of requests in flight; record what each answer says."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass

import aiohttp
import orjson

from sgl_moe.policy_bench.stream import StreamUnit


@dataclass
class Record:
    latency_s: float
    status: int
    prompt_tokens: int
    cached_tokens: int
    worker: str | None
    error: str | None = None


async def _send(session: aiohttp.ClientSession, url: str, unit: StreamUnit) -> Record:
    t0 = time.perf_counter()
    try:
        async with session.post(f"{url}/generate", data=orjson.dumps(unit.body()),
                                headers={"content-type": "application/json"}) as resp:
            payload = await resp.read()
            status, worker = resp.status, resp.headers.get("x-sgl-moe-worker")
    except (TimeoutError, aiohttp.ClientError) as exc:
        return Record(time.perf_counter() - t0, 0, unit.prompt_tokens, 0, None, f"{type(exc).__name__}: {exc}")
    latency = time.perf_counter() - t0
    if status != 200:
        return Record(latency, status, unit.prompt_tokens, 0, worker, payload[:200].decode(errors="replace"))
    meta = orjson.loads(payload).get("meta_info", {})
    return Record(latency, status, int(meta.get("prompt_tokens", unit.prompt_tokens)),
                  int(meta.get("cached_tokens", 0)), worker)


async def run_stream(url: str, units: list[StreamUnit], concurrency: int, *, progress: bool = True,
                     timeout_s: float = 600.0) -> tuple[list[Record], float]:
    """``(records in stream order, wall seconds from the first send to the last answer)``."""
    records: list[Record | None] = [None] * len(units)
    next_index = 0
    done = 0
    t0 = time.perf_counter()
    last_print = t0

    async def worker_loop(session: aiohttp.ClientSession) -> None:
        nonlocal next_index, done, last_print
        while next_index < len(units):
            i = next_index
            next_index += 1
            records[i] = await _send(session, url, units[i])
            done += 1
            now = time.perf_counter()
            if progress and (now - last_print > 5 or done == len(units)):
                last_print = now
                print(f"  {done}/{len(units)} requests, {done / (now - t0):.1f} req/s", file=sys.stderr, flush=True)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker_loop(session) for _ in range(min(concurrency, len(units)))))
    return [r for r in records if r is not None], time.perf_counter() - t0


async def run_open(url: str, units: list[StreamUnit], rate_rps: float, seed: int, *, progress: bool = True,
                   timeout_s: float = 600.0) -> tuple[list[Record], float]:
    """Open loop: unit i is sent at its Poisson arrival time (seeded), whatever is still in flight.

    Wall seconds run from the first send to the last answer, so req/s is the offered rate while the
    routers keep up and falls below it when they do not.
    """
    import random

    rng = random.Random(seed)
    at, t = [], 0.0
    for _ in units:
        at.append(t)
        t += rng.expovariate(rate_rps)
    records: list[Record | None] = [None] * len(units)
    done = 0
    t0 = time.perf_counter()
    last_print = t0

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal done, last_print
        delay = at[i] - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        records[i] = await _send(session, url, units[i])
        done += 1
        now = time.perf_counter()
        if progress and (now - last_print > 5 or done == len(units)):
            last_print = now
            print(f"  {done}/{len(units)} requests (offered {rate_rps:.2f} req/s)", file=sys.stderr, flush=True)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(one(session, i) for i in range(len(units))))
    return [r for r in records if r is not None], time.perf_counter() - t0
