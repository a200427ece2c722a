"""The router's tokenizer: build time, router start-up time to ready, tokenization throughput, RSS.

    .venv/bin/python benchmarks/tokenizer_bench.py [--prompts 2000] [--repeats 3] [--json OUT]

Smallest run (seconds; what CI runs): ``--prompts 10 --repeats 1``.

Everything goes through the router's own path, in fresh interpreters, against a stand-in worker (an aiohttp
server answering ``/sgl_moe/info`` for the shipped model and serving whatever tokenizer files that info
advertises), so the same code measures any ``RouterTokenizer`` implementation:

1. **build**: ``Discovery.fetch_info`` + ``Discovery.fetch_tokenizer`` in a fresh interpreter (imports count),
   then again in the same interpreter (warm); peak RSS of that interpreter.
2. **start-up**: ``python -m sgl_moe.router --worker-urls <stand-in>`` from spawn until ``GET /workers``
   shows the worker healthy (the tokenizer is built before it joins); the router's RSS when ready.
3. **throughput**: ``encode_batch`` of N mixed prompts of 50-2,000 words (prose, code, non-ASCII, whitespace
   runs) and ``encode`` one prompt at a time, single-threaded (``RAYON_RS_NUM_CPUS=1``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from sgl_moe import DEFAULT_MODEL_DIR, saturation, wire
from sgl_moe.flops import FlopsModel
from sgl_moe.harness.router_process import RouterProcess
from sgl_moe.harness.worker_process import free_port
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.info import build_info

WORDS = ("the of and to in is that for it as with was on be by this are from or at an which have not but all "
         "model router token prefix cache worker expert layer batch request prompt latency throughput").split()
CODE = ["def f(x):\n    return x + 1\n", "for (int i = 0; i < n; ++i) { s += a[i]; }", "import os, sys\n",
        "    if x is None:\n        raise ValueError('x')\n", "SELECT id, name FROM t WHERE a > 3;"]
UNICODE = ["héllo", "wörld", "naïve", "中文", "日本語", "🙂", "✓", "Ελλάδα", "مرحبا", "\u00a0", "—"]


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` prompts of 50 to 2,000 words: mostly prose, with code, non-ASCII words and whitespace runs."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(50, 2000)):
            r = rng.random()
            parts.append(rng.choice(CODE) if r < 0.03 else rng.choice(UNICODE) if r < 0.08
                         else " " * rng.randint(2, 6) if r < 0.10 else rng.choice(WORDS))
        out.append(" ".join(parts))
    return out


def stand_in_app() -> web.Application:
    """Answers ``/sgl_moe/info`` and serves every tokenizer file of the shipped model (old and new routes)."""
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    info = build_info(model_name="tiny", model_path=str(DEFAULT_MODEL_DIR), tokenizer_path=str(DEFAULT_MODEL_DIR),
                      hf_config=config, instance_id="bench", context_length=4096, page_size=16, step_tokens=4096,
                      dp_size=1, kv_events_config=None, prefix_caching=True, device="none",
                      sglang_version="stand-in", moe=MoeArgs(),
                      theta=saturation.without_transfer(FlopsModel.from_hf_config(config).request_flops(0, 4096),
                                                        4096, 1.0))

    async def file(request: web.Request) -> web.StreamResponse:
        path = DEFAULT_MODEL_DIR / request.match_info["name"]
        return web.FileResponse(path) if path.is_file() else web.Response(status=404)

    app = web.Application()
    app.router.add_get(wire.INFO_PATH, lambda r: web.Response(body=wire.encode(info), content_type="application/json"))
    app.router.add_get("/sgl_moe/tokenizer/{name:.+}", file)
    app.router.add_get("/sgl_moe/{name:tokenizer[_a-z]*\\.json}", file)
    app.router.add_get("/health", lambda r: web.Response(text="ok"))
    return app


async def start_stand_in() -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(stand_in_app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def fetch_tokenizer(url: str):
    from sgl_moe.router.membership.discovery import Discovery

    async with aiohttp.ClientSession() as session:
        discovery = Discovery(session)
        return await discovery.fetch_tokenizer(url, await discovery.fetch_info(url))


def rss_mib(pid: int | None = None) -> tuple[float, float]:
    """(current, peak) resident set size in MiB from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def phase_build(n_prompts: int) -> dict:
    """Run in a fresh interpreter: cold and warm tokenizer build, then single-threaded throughput."""
    from sgl_moe.router.request import router_tokenizer

    if hasattr(router_tokenizer, "keep_torch_out"):
        router_tokenizer.keep_torch_out()  # as ``python -m sgl_moe.router`` does first
    runner, url = await start_stand_in()
    try:
        t0 = time.perf_counter()
        tok = await fetch_tokenizer(url)
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(3):
            t0 = time.perf_counter()
            await fetch_tokenizer(url)
            warm.append(time.perf_counter() - t0)
    finally:
        await runner.cleanup()
    current, peak = rss_mib()  # before the prompts and their ids take memory
    texts = prompts(n_prompts)
    tok.encode_batch(texts[:20])
    t0 = time.perf_counter()
    batch = tok.encode_batch(texts)
    batch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    single = [tok.encode(t) for t in texts]
    single_s = time.perf_counter() - t0
    assert single == batch
    tokens = sum(map(len, batch))
    heavy = sorted({m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}
                   & {"torch", "sglang", "transformers"})
    return {"build_cold_s": cold, "build_warm_s": statistics.median(warm), "prompts": len(texts), "tokens": tokens,
            "words": sum(len(t.split()) for t in texts), "batch_tokens_per_s": tokens / batch_s,
            "batch_prompts_per_s": len(texts) / batch_s, "single_tokens_per_s": tokens / single_s,
            "single_prompts_per_s": len(texts) / single_s, "rss_mib": current, "peak_rss_mib": peak,
            "exact": tok.exact, "heavy_modules": heavy}


async def phase_startup() -> dict:
    runner, url = await start_stand_in()
    router = RouterProcess(log_path=Path(".work/logs/tokenizer-bench-router.log"), worker_urls=[url],
                           args=["--log-level", "warning"])
    try:
        t0 = time.perf_counter()
        router.start()
        await asyncio.to_thread(router.wait_ready, 120)
        ready = time.perf_counter() - t0
        current, peak = rss_mib(router.proc.pid)
    finally:
        router.stop()
        await runner.cleanup()
    return {"startup_to_ready_s": ready, "router_rss_mib": current, "router_peak_rss_mib": peak}


def run_phase(phase: str, n_prompts: int) -> dict:
    env = {**os.environ, "RAYON_RS_NUM_CPUS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, __file__, "--phase", phase, "--prompts", str(n_prompts)], env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"phase {phase} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--phase", choices=("build", "startup"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.repeats < 1:
        parser.error(f"--prompts and --repeats must be positive, got {args.prompts} and {args.repeats}")
    if args.phase:
        coro = phase_build(args.prompts) if args.phase == "build" else phase_startup()
        print(json.dumps(asyncio.run(coro)))
        return 0
    try:
        builds = [run_phase("build", args.prompts) for _ in range(args.repeats)]
        starts = [run_phase("startup", args.prompts) for _ in range(args.repeats)]
    except RuntimeError as exc:  # a phase's interpreter failed: its stderr, not this process's traceback
        print(f"tokenizer_bench: {exc}", file=sys.stderr)
        return 1
    med = {k: statistics.median(b[k] for b in builds) for k in builds[0] if isinstance(builds[0][k], float)}
    med |= {k: statistics.median(s[k] for s in starts) for k in starts[0]}
    b = builds[0]
    print(f"model {DEFAULT_MODEL_DIR.name}; medians of {args.repeats} fresh interpreters; {os.cpu_count()} cores")
    print(f"  tokenizer build (fetch + load)  cold {med['build_cold_s'] * 1e3:8.1f} ms   "
          f"warm {med['build_warm_s'] * 1e3:8.1f} ms   exact={b['exact']}")
    print(f"  router start-up to ready        {med['startup_to_ready_s']:8.2f} s      "
          f"RSS {med['router_rss_mib']:.0f} MiB (peak {med['router_peak_rss_mib']:.0f})")
    print(f"  build interpreter after build   RSS {med['rss_mib']:.0f} MiB (peak {med['peak_rss_mib']:.0f}); "
          f"heavy modules loaded: {b['heavy_modules'] or 'none'}")
    print(f"  {b['prompts']} prompts, {b['words']} words, {b['tokens']} tokens, 1 thread:")
    print(f"    encode_batch  {med['batch_tokens_per_s'] / 1e6:6.2f} M tokens/s  {med['batch_prompts_per_s']:8.0f} "
          f"prompts/s")
    print(f"    encode (each) {med['single_tokens_per_s'] / 1e6:6.2f} M tokens/s  {med['single_prompts_per_s']:8.0f} "
          f"prompts/s")
    if args.json:
        args.json.write_text(json.dumps({"medians": med, "builds": builds, "startups": starts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
