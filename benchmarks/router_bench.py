"""Router benchmarks: routing-decision time at scale, and request rate against workers it cannot saturate.

    .venv/bin/python benchmarks/router_bench.py [--workers 64] [--prompt-tokens 4096] [--requests 2000]
                                                [--rate-seconds 10] [--concurrency 64]

Smallest run (seconds; what CI runs): ``--workers 2 --prompt-tokens 64 --requests 20 --rate-seconds 0.5
--concurrency 2 --stand-ins 1 --prompt-words 10 --routers longest_block_match``.

1. **Decision time** (in process): the real scheduler, block index and pending ledger with 64 workers whose
   committed tables hold 4,096-token prompts; each request is a 4,096-token prompt that shares a prefix
   of random length with one of them (or nothing). Reports p50/p99 of block hashing and of the decision
   (match over all workers, cost per worker, choice, reservation), separately; tokenization is excluded.
2. **Request rate** (real processes over HTTP): ``python -m sgl_moe.router`` in front of stand-in workers
   that answer ``/generate`` at once (an aiohttp server serving a real ``/sgl_moe/info`` of the shipped
   model), so the router, not the workers, is the bottleneck. The same load sent straight to one stand-in
   shows what the load generator itself can do on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from pathlib import Path

import aiohttp
from aiohttp import web

from sgl_moe import DEFAULT_MODEL_DIR, saturation, wire
from sgl_moe.flops import FlopsModel
from sgl_moe.harness.worker_process import free_port
from sgl_moe.policy_bench.routers import OURS, POLICIES, RouterUnderTest, label
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.service import tune_gc
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.scheduler import Scheduler
from sgl_moe.router.request.block_hash import block_hashes
from sgl_moe.simulator.report import machine
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.info import build_info

PAGE = 16


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class _Pool:
    installs = 0

    def __init__(self, workers):
        self.workers = {w.id: w for w in workers}

    def routable(self, exclude=frozenset()):
        return [w for w in self.workers.values() if w.id not in exclude]


def decision_benchmark(n_workers: int, prompt_tokens: int, n_requests: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    flops = FlopsModel.from_hf_config(config)
    index = BlockIndex()
    ledger = PendingLedger(index, ttl_s=10)
    theta = flops.request_flops(0, prompt_tokens) * 8
    info = wire.WorkerInfo(model_name="bench", page_size=PAGE, flops=flops,
                           saturation=wire.SaturationInfo(flops=theta, source="bench", state="fixed"))
    workers = [Worker(id=f"w{i}", url="", info=info, flops=flops, theta=theta, theta_source="bench",
                      slots={0: index.add_target()}) for i in range(n_workers)]
    # Each worker holds 4 distinct 4096-token documents; requests share a random-length prefix with one.
    docs = []
    for w in workers:
        for _ in range(4):
            doc = [rng.randrange(4096) for _ in range(prompt_tokens)]
            docs.append(doc)
            index.store(w.slots[0], block_hashes(doc, PAGE))
    sched = Scheduler(RouterConfig(), _Pool(workers), index, ledger)
    tune_gc()  # as the router process does at start-up
    hash_s, decide_s = [], []
    in_flight = []
    for i in range(n_requests):
        if rng.random() < 0.8:
            doc = rng.choice(docs)
            keep = rng.randrange(0, prompt_tokens)
            prompt = doc[:keep] + [rng.randrange(4096) for _ in range(prompt_tokens - keep)]
        else:
            prompt = [rng.randrange(4096) for _ in range(prompt_tokens)]
        t0 = time.perf_counter()
        keys = block_hashes(prompt, PAGE)
        hash_s.append(time.perf_counter() - t0)
        job = Job(rid=str(i), prompt_lens=[len(prompt)], keys=[keys])
        placement = sched.try_place(job)
        assert placement is not None
        decide_s.append(placement.decision_s)
        in_flight.append(placement)
        if len(in_flight) > 2 * n_workers:  # keep a steady in-flight population
            sched.release(in_flight.pop(0), ok=True)
    return {"workers": n_workers, "prompt_tokens": prompt_tokens, "requests": n_requests,
            "hash_p50_us": pct(hash_s, 0.5) * 1e6, "hash_p99_us": pct(hash_s, 0.99) * 1e6,
            "decision_p50_us": pct(decide_s, 0.5) * 1e6, "decision_p99_us": pct(decide_s, 0.99) * 1e6,
            "hash_plus_decision_p99_us": pct([a + b for a, b in zip(hash_s, decide_s)], 0.99) * 1e6}


def stand_in_worker_app() -> web.Application:
    """Answers like a worker, instantly: enough for the router to discover it and proxy to it."""
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    info = build_info(model_name=str(DEFAULT_MODEL_DIR), model_path=str(DEFAULT_MODEL_DIR),
                      tokenizer_path=str(DEFAULT_MODEL_DIR), hf_config=config, instance_id=uuid.uuid4().hex,
                      context_length=4096, page_size=PAGE, step_tokens=4096, dp_size=1, kv_events_config=None,
                      prefix_caching=True, device="none", sglang_version="stand-in", moe=MoeArgs(),
                      theta=saturation.without_transfer(FlopsModel.from_hf_config(config).request_flops(0, 4096),
                                                        4096, 1.0))
    reply = json.dumps({"text": "x", "output_ids": [5], "meta_info": {"prompt_tokens": 1, "cached_tokens": 0}})
    tok = (DEFAULT_MODEL_DIR / "tokenizer.json").read_bytes()
    tok_cfg = (DEFAULT_MODEL_DIR / "tokenizer_config.json").read_bytes()

    async def generate(request):
        await request.read()
        return web.Response(text=reply, content_type="application/json")

    app = web.Application()
    app.router.add_get(wire.INFO_PATH, lambda r: web.Response(body=wire.encode(info), content_type="application/json"))
    app.router.add_get("/sgl_moe/tokenizer.json", lambda r: web.Response(body=tok, content_type="application/json"))
    app.router.add_get("/sgl_moe/tokenizer_config.json",
                       lambda r: web.Response(body=tok_cfg, content_type="application/json"))
    app.router.add_get(wire.TOKENIZER_FILES_PATH + "/{name}",  # every file the info lists
                       lambda r: web.FileResponse(DEFAULT_MODEL_DIR / r.match_info["name"]))
    app.router.add_get("/health", lambda r: web.Response(text="ok"))
    app.router.add_post("/generate", generate)
    return app


async def drive(url: str, seconds: float, concurrency: int, prompt_words: int) -> dict:
    rng = random.Random(1)
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def client(session):
        nonlocal errors
        while time.perf_counter() < stop:
            text = f"doc {rng.randrange(64)}: " + " ".join(f"w{rng.randrange(500)}" for _ in range(prompt_words))
            body = {"text": text, "sampling_params": {"max_new_tokens": 1}}
            t0 = time.perf_counter()
            async with session.post(url + "/generate", json=body) as resp:
                await resp.read()
                if resp.status != 200:
                    errors += 1
            latencies.append(time.perf_counter() - t0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"requests": len(latencies), "errors": errors, "req_per_s": len(latencies) / elapsed,
            "p50_ms": pct(latencies, 0.5) * 1e3, "p99_ms": pct(latencies, 0.99) * 1e3}


async def rate_benchmark(n_stand_ins: int, seconds: float, concurrency: int, prompt_words: int,
                         routers: list[str], router_args: list[str]) -> dict:
    """Each router in ``routers`` started fresh in front of the same stand-ins and driven for ``seconds``; its
    processes' CPU seconds (user + system) over the drive, per request, is the router's own cost."""
    runners, urls = [], []
    for _ in range(n_stand_ins):
        runner = web.AppRunner(stand_in_worker_app(), access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
    out = {"stand_ins": n_stand_ins, "concurrency": concurrency, "prompt_words": prompt_words, "seconds": seconds}
    try:
        out["direct_to_stand_in"] = await drive(urls[0], seconds, concurrency, prompt_words)
        for policy in routers:
            router = RouterUnderTest(policy, urls, Path(f".work/logs/bench-router-{policy}.log"),
                                     ["--log-level", "warning", *router_args] if policy in OURS else [])
            try:
                await asyncio.to_thread(router.start, 120)
                await drive(router.url, min(2.0, seconds), concurrency, prompt_words)  # warm-up: connections, caches
                cpu0 = router.cpu_seconds()
                result = await drive(router.url, seconds, concurrency, prompt_words)
                cpu1 = router.cpu_seconds()
            finally:
                router.stop()
            if cpu0 is not None and cpu1 is not None and result["requests"]:
                result["router_cpu_s"] = cpu1 - cpu0
                result["router_cpu_ms_per_request"] = (cpu1 - cpu0) / result["requests"] * 1e3
            out[label(policy)] = result
    finally:
        for runner in runners:
            await runner.cleanup()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate-seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stand-ins", type=int, default=4)
    parser.add_argument("--prompt-words", type=int, default=200)
    parser.add_argument("--routers", nargs="+", default=["longest_block_match", "cache_aware"], choices=POLICIES,
                        help="routers driven one after another (sgl_moe policies or sglang-router's)")
    parser.add_argument("--router-args", default="", help="extra flags for sgl_moe's router")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--skip-decision", action="store_true", help="only the request-rate part")
    args = parser.parse_args(argv)
    if min(args.workers, args.prompt_tokens, args.requests, args.concurrency, args.stand_ins, args.prompt_words) < 1:
        parser.error("--workers, --prompt-tokens, --requests, --concurrency, --stand-ins and --prompt-words must be "
                     "positive")
    if args.rate_seconds <= 0:
        parser.error(f"--rate-seconds must be positive, got {args.rate_seconds}")
    d = None
    if not args.skip_decision:
        print(f"decision time: {args.workers} workers, {args.prompt_tokens}-token prompts, {args.requests} "
              "requests ...", flush=True)
        d = decision_benchmark(args.workers, args.prompt_tokens, args.requests)
        print(f"  block hashing  p50 {d['hash_p50_us']:7.1f} us   p99 {d['hash_p99_us']:7.1f} us")
        print(f"  decision       p50 {d['decision_p50_us']:7.1f} us   p99 {d['decision_p99_us']:7.1f} us "
              f"(match + cost + choice + reservation; target p99 < 1000 us)")
        print(f"  hash+decision  p99 {d['hash_plus_decision_p99_us']:7.1f} us")
    print(f"request rate: routers in front of {args.stand_ins} instant stand-in workers, {args.concurrency} "
          f"concurrent clients, {args.prompt_words}-word prompts, {args.rate_seconds:.0f} s each ...", flush=True)
    r = asyncio.run(rate_benchmark(args.stand_ins, args.rate_seconds, args.concurrency, args.prompt_words,
                                   args.routers, args.router_args.split()))
    for name, x in r.items():
        if not isinstance(x, dict):
            continue
        cpu = (f"router CPU {x['router_cpu_ms_per_request']:.2f} ms/request"
               if "router_cpu_ms_per_request" in x else "")
        print(f"  {name:<34} {x['req_per_s']:8.0f} req/s   p50 {x['p50_ms']:6.1f} ms   p99 {x['p99_ms']:6.1f} ms   "
              f"({x['requests']} requests, {x['errors']} errors)  {cpu}")
    result = {"decision": d, "rate": r, "machine": machine()}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
