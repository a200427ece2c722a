"""Router capacity: the router's own CPU per request, next to sglang-router's, in front of instant workers.

    .venv/bin/python benchmarks/router_capacity.py [--routers sgl_moe cache_aware round_robin]
        [--prompt-tokens 200 2000 4000] [--shapes shared unique] [--requests 1500] [--warmup 200]
        [--concurrency 32] [--repeats 2] [--front-processes 1] [--out FILE.json]

Smallest run (about a minute; what CI runs): ``--prompt-tokens 200 --shapes shared unique --requests 200
--warmup 10 --concurrency 4 --repeats 1 --routers sgl_moe round_robin``.

The routers, each started fresh for every (stream, repeat), in front of the same 4 stand-in workers
(``StandInWorker(per_token_s=0, step_s=0)`` of ``sgl_moe.policy_bench.standin``, answering at once without
tokenizing, served from a child process of this script so their CPU is nobody's router's). With ``--kv-events``
(the default) each stand-in keeps a cache of ``STAND_IN_EVENTS_POOL_TOKENS`` and publishes the pages a request
sent as token ids stores and evicts, through SGLang's own ``ZmqEventPublisher``, as a worker started by
``sgl_moe.launch_server`` does: sgl_moe's router then keeps its committed table from the events and retires its
promises when their blocks are reported stored, as in front of real workers. ``--no-kv-events``: no events, so
every promise lives out the router's ``--pending-ttl-s`` (the testbed of the figures before 2026-11-28's
twentieth session). sglang-router reads no events either way.

* ``sgl_moe``: ``python -m sgl_moe.router`` with its default policy ``longest_block_match`` (and
  ``--front-processes N`` for each N > 1 of ``--front-processes``; a router that refuses it is reported
  "not available");
* ``cache_aware`` and ``round_robin``: sglang-router (``python -m sglang_router.launch_router``).

Streams (deterministic from ``--seed``): text prompts to ``/generate`` with ``max_new_tokens`` 1 (prefill
only), of each ``--prompt-tokens`` length (tokens of the shipped model's tokenizer, approximately) in two
shapes: ``shared``, one of 40 Zipf-popular multi-line instruction blocks (90% of the prompt) then a unique
tail of a line or two after a newline (classification traffic), and ``unique``, every prompt different text
from its first token. The text is words, punctuation, numbered rules, examples and code lines.

Load: closed loop, ``--concurrency`` requests in flight; per (router, stream) ``--warmup`` requests first
(excluded), then ``--requests`` measured. The order of the routers (and of the direct baseline) changes
between repeats (``run_order``: the second runs the first's in reverse), since the router measured first runs slower.
Before a stream's first measured run, a router (the first of ``--routers``, not instrumented) runs it once unmeasured
(``--warm-up-run``, on by default): the first router measured ran slower (b3bd5c7, 2026-11-29), a slot the order's
rotation does not cover. The stand-ins' caches are emptied before every run (``StandIns.flush``), so each run's
warm-up fills them alike and its measured requests store what is new to them, as in service; until 2026-12-02 the
caches were left full by the run before, which on the shared streams meant no page stored and no KV event for
sgl_moe's router to read in its measured window (``events_stored_in_window`` now says how many blocks it read there).

Figures per (router, stream), pooled over the repeats:

* **CPU ms/request**: user + system CPU seconds of the router's whole process tree (psutil, children
  included) over the measured window, divided by its requests: the router's own cost; **user / kernel**, the
  same split in two: the kernel's share is mostly socket work (on loopback a write also runs the receiving side's
  TCP path), which any router pays for the same reads and writes, so the user share is where routers differ;
* **req/s** over the measured window (bounded by this machine: the load generator and the stand-ins share
  its cores with the router; their CPU per request is in the JSON);
* **p50 / p99** client latency through the router, and the same stream sent straight to a stand-in
  (``direct``, measured in the same run); **added** p50 / p99 = router's percentile minus direct's
  (a difference of percentiles, not a percentile of differences);
* **errors** (non-200 or failed requests, warm-up included): a row with any is flagged;
* with ``--front-processes N`` > 1, **owner ms/req**: the placement owner's CPU alone per request, and
  **owner bound** = 1 / that: the req/s at which the one serial process would be saturated, with a core for each
  front (the fronts scale with cores; the owner does not).

The table is printed as markdown; ``--out`` writes every figure, each repeat's too, the machine, the
command line, and per stream the ratio sgl_moe CPU per request / cache_aware's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Coroutine
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.harness import callgrind, native_modules
from sgl_moe.policy_bench.driver import Record, run_stream
from sgl_moe.policy_bench.routers import RouterUnderTest, flush_caches
from sgl_moe.policy_bench.stream import StreamUnit

ROUTERS = {"sgl_moe": ("sgl_moe", "longest_block_match"), "cache_aware": ("sglang-router", "cache_aware"),
           "round_robin": ("sglang-router", "round_robin"), "sgl_moe_no_memo": ("sgl_moe", "longest_block_match"),
           "sgl_moe_baseline": ("sgl_moe", "longest_block_match"),
           "sgl_moe_aiohttp": ("sgl_moe", "longest_block_match"),
           "sgl_moe_unqueued": ("sgl_moe", "longest_block_match")}
"""``--routers`` name -> (engine, policy). ``sgl_moe_no_memo`` (not run unless named): sgl_moe with
``--no-prefix-memo``, every text encoded whole. ``sgl_moe_aiohttp``: sgl_moe with ``--http-server aiohttp``, every
request on aiohttp's server instead of the bare protocols. ``sgl_moe_unqueued``: sgl_moe with Θ pinned out of reach
(``--saturation-flops 1e30``), every request admitted at once as sglang-router does: its difference from ``sgl_moe``
is what the admission queue costs where the stand-ins' Θ holds requests back (unique prompts). ``sgl_moe_baseline``:
sgl_moe's router from the checkout ``--baseline`` names (e.g. a ``git worktree`` of an older commit), to compare two
versions in one run. A checkout whose C extensions do not import (a worktree holds no built ``.so`` files) is
refused, with the command that builds them in place (``sgl_moe.harness.native_modules``): it would run their Python
references and measure slower than it is. ``--allow-python-fallbacks`` measures it anyway."""
DEFAULT_ROUTERS = ["sgl_moe", "cache_aware", "round_robin"]
INSTRUMENTED_START_S = 900.0
"""How long a router under callgrind (``--instructions``) may take to start: tens of times its usual seconds."""
SHAPES = ("shared", "unique")
SHARED_PREFIXES = 40
SHARED_FRACTION = 0.9
ZIPF_S = 1.1
CONTEXT_LENGTH = 4096
"""The stand-ins' context length (``StandInFleet``): a prompt plus its one new token must fit."""
STAND_IN_POOL_TOKENS = 4096
STAND_IN_EVENTS_POOL_TOKENS = 262_144
"""Each stand-in's cache with ``--kv-events``: 16,384 pages, the order of a GPU worker's KV pool for a mid-size model
(the shared streams' 40 prefixes fit; the unique streams evict about as many pages as they store)."""
DIRECT = "direct to stand-in"


class BenchError(Exception):
    """Something the benchmark needs is unreachable: reported as one line, exit status 1."""


# -- text --------------------------------------------------------------------------------------------------------

NOUNS = ("customer order ticket invoice account payment refund label message request product address delivery "
         "package subscription plan card balance report record field value answer question user team manager "
         "policy rule example document section summary note reply warranty item store price discount code "
         "server error log file queue batch cache token prompt model worker router result").split()
VERBS = ("mentions asks describes reports requests explains confirms cancels updates changes returns expects "
         "receives sends needs shows contains includes references quotes disputes repeats").split()
ADJS = ("urgent late missing damaged wrong duplicate new old open closed pending partial full monthly annual "
        "final short long empty invalid expired recent previous current second first").split()
FILLERS = ("the a this that every each any some no their our its").split()
LINKS = ("and but or because so although when if while unless after before").split()
LABELS = ("billing shipping returns account technical sales feedback other spam").split()
IDENTS = ("ticket order user item row cfg req resp batch cache key value result labels text score").split()
ATTRS = ("id status priority amount created_at items total name email region count").split()
FUNCS = ("classify normalize route lookup score parse validate extract summarize").split()


def _sentence(rng: random.Random, lo: int = 6, hi: int = 16) -> str:
    words = []
    for _ in range(rng.randint(lo, hi)):
        r = rng.random()
        words.append(rng.choice(NOUNS) if r < 0.35 else rng.choice(VERBS) if r < 0.55 else
                     rng.choice(ADJS) if r < 0.7 else rng.choice(FILLERS) if r < 0.88 else rng.choice(LINKS))
        if rng.random() < 0.06:
            words[-1] += ","
        elif rng.random() < 0.03:
            words.append(str(rng.randint(2, 9999)))
    words[0] = words[0].capitalize()
    return " ".join(words).rstrip(",") + rng.choice(".....?!")


def _prose(rng):
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))


def _rule(rng):
    return (f"{rng.randint(1, 12)}. If the {rng.choice(NOUNS)} {rng.choice(VERBS)} {rng.choice(FILLERS)} "
            f"{rng.choice(ADJS)} {rng.choice(NOUNS)}, answer \"{rng.choice(LABELS)}\".")


def _bullet(rng):
    return f"- {rng.choice(NOUNS).capitalize()}: {_sentence(rng, 4, 10)}"


def _example(rng):
    return f"Example: \"{_sentence(rng, 5, 12)}\" -> {rng.choice(LABELS)}"


def _code(rng):
    ident, attr = rng.choice(IDENTS), rng.choice(ATTRS)
    r = rng.random()
    if r < 0.3:
        return (f"    if {ident}.{attr} {rng.choice(('>', '<', '==', '!=', '>='))} {rng.randint(0, 500)}: "
                f"return {rng.choice(FUNCS)}({ident}, {rng.choice(IDENTS)}={rng.choice(IDENTS)})")
    if r < 0.55:
        return f"    {ident} = {rng.choice(FUNCS)}({rng.choice(IDENTS)}.{attr})  # {_sentence(rng, 3, 7).lower()}"
    if r < 0.75:
        return f"def {rng.choice(FUNCS)}_{ident}({ident}: dict, {rng.choice(IDENTS)}: list[str]) -> str:"
    return f"    for {ident} in {rng.choice(IDENTS)}s: {rng.choice(IDENTS)}[{ident}.{attr}] += 1"


def _heading(rng):
    return "## " + " ".join(w.capitalize() for w in (rng.choice(ADJS), rng.choice(NOUNS), rng.choice(NOUNS)))


INSTRUCTION_LINES = (_prose, _prose, _rule, _rule, _bullet, _example, _code, _code, _heading)
TAIL_LINES = (_prose,)


class Filler:
    """Lines of text up to a token budget, counted exactly with the shipped tokenizer: no BPE merge crosses a
    newline there (``sgl_moe.workloads.segments``), so lines joined by ``\\n`` cost their tokens plus one each."""

    def __init__(self):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(DEFAULT_MODEL_DIR / "tokenizer.json"))

    def count(self, text: str) -> int:
        return len(self.tok.encode(text).ids)

    def fill(self, rng: random.Random, budget: int, makers, first: str | None = None) -> tuple[str, int]:
        lines: list[str] = []
        used = 0
        while True:
            batch = ([first] if first is not None and not lines else []) + [rng.choice(makers)(rng) for _ in range(12)]
            for line, e in zip(batch, self.tok.encode_batch(batch)):
                cost = len(e.ids) + (1 if lines else 0)
                if used + cost <= budget:
                    lines.append(line)
                    used += cost
                    continue
                words = line.split(" ")  # the last line, cut to what fits
                while len(words) > 1:
                    words.pop()
                    cost = self.count(" ".join(words)) + (1 if lines else 0)
                    if used + cost <= budget:
                        lines.append(" ".join(words))
                        used += cost
                        break
                return "\n".join(lines), used


@dataclass(frozen=True)
class Stream:
    name: str
    shape: str
    target_tokens: int
    warmup: list[StreamUnit]
    measured: list[StreamUnit]

    def summary(self) -> dict:
        lens = [u.prompt_tokens for u in self.warmup + self.measured]
        return {"shape": self.shape, "target_tokens": self.target_tokens, "warmup": len(self.warmup),
                "requests": len(self.measured), "tokens_mean": sum(lens) / len(lens), "tokens_min": min(lens),
                "tokens_max": max(lens),
                **({"shared_prefixes": SHARED_PREFIXES, "shared_fraction": SHARED_FRACTION, "zipf_s": ZIPF_S}
                   if self.shape == "shared" else {})}


def build_stream(filler: Filler, shape: str, tokens: int, warmup: int, requests: int, seed: int) -> Stream:
    """``warmup + requests`` prompts of about ``tokens`` tokens (never more), the same for every router."""
    rng = random.Random(f"router_capacity/{seed}/{shape}/{tokens}")
    n = warmup + requests
    texts = []
    if shape == "shared":
        prefixes = []
        for g in range(SHARED_PREFIXES):
            first = f"{_heading(rng)[3:]} (instructions {seed}-{g}):"
            prefixes.append(filler.fill(rng, round(tokens * SHARED_FRACTION), INSTRUCTION_LINES, first))
        weights = [1.0 / (r + 1) ** ZIPF_S for r in range(SHARED_PREFIXES)]
        for i, g in enumerate(rng.choices(range(SHARED_PREFIXES), weights=weights, k=n)):
            prefix, used = prefixes[g]
            tail, _ = filler.fill(rng, tokens - used - 1, TAIL_LINES, f"Input {i}: {_sentence(rng)}")
            texts.append(prefix + "\n" + tail)
    else:
        for _ in range(n):  # the first line alone tells them apart
            texts.append(filler.fill(rng, tokens, INSTRUCTION_LINES + TAIL_LINES, _prose(rng))[0])
    name = f"{shape}-{tokens}"
    units = [StreamUnit(f"{name}/{i}", name, t, len(e.ids)) for i, (t, e) in
             enumerate(zip(texts, filler.tok.encode_batch(texts)))]
    return Stream(name, shape, tokens, units[:warmup], units[warmup:])


# -- stand-ins in a child process ---------------------------------------------------------------------------------

def _serve_stand_ins(n: int, kv_events: bool, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    try:
        from sgl_moe.policy_bench.standin import StandInFleet

        pool = STAND_IN_EVENTS_POOL_TOKENS if kv_events else STAND_IN_POOL_TOKENS
        fleet = StandInFleet(n, pool, per_token_s=0.0, step_s=0.0, tokenize=False, kv_events=kv_events).start()
    except Exception as exc:  # noqa: BLE001 - reported by the parent as one line
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", fleet.urls))
    try:
        conn.recv()
    except (EOFError, OSError):
        pass
    fleet.stop()


class StandIns:
    def __init__(self, n: int, kv_events: bool = False):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve_stand_ins, args=(n, kv_events, child), daemon=True, name="stand-ins")
        self.urls: list[str] = []

    def start(self, timeout: float = 120.0) -> StandIns:
        self.proc.start()
        if not self._conn.poll(timeout):
            raise BenchError(f"the stand-in workers did not start in {timeout:.0f} s")
        try:
            status, value = self._conn.recv()
        except EOFError:
            raise BenchError(f"the stand-in workers' process exited ({self.proc.exitcode})") from None
        if status != "ok":
            raise BenchError(f"the stand-in workers did not start: {value}")
        self.urls = value
        return self

    async def flush(self) -> None:
        """Empty every stand-in's cache (``policy_bench.routers.flush_caches``; with KV events, an
        ``AllBlocksCleared``): each run meets the same empty caches, its warm-up fills them, and its measured requests
        store what is new to them (their own tails, the rarer prefixes) as they would in service. Runs that met caches
        left full by the run before stored nothing on a shared stream (the 40 prefixes and every prompt of the
        stream fit), so sgl_moe's router read no KV events in its measured window there."""
        try:
            await asyncio.to_thread(flush_caches, self.urls, 30.0)
        except Exception as exc:  # noqa: BLE001 - RuntimeError (refused) or httpx's errors: reported as one line
            raise BenchError(f"the stand-ins would not empty their caches: {exc}") from None

    def cpu_seconds(self) -> float | None:
        try:
            import psutil

            t = psutil.Process(self.proc.pid).cpu_times()
            return t.user + t.system
        except Exception:  # noqa: BLE001 - a diagnostic only
            return None

    def stop(self) -> None:
        try:
            self._conn.send("stop")
        except (OSError, ValueError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# -- runs ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RouterSpec:
    name: str
    """``--routers`` name."""
    engine: str
    policy: str
    front_processes: int = 1
    source: Path | None = None
    """``sgl_moe_baseline``: the checkout its router runs from."""
    python: str | None = None
    """``sgl_moe_baseline``: the interpreter its router runs on (None: this one)."""

    @property
    def label(self) -> str:
        base = f"{self.engine} {self.policy}" + (" --no-prefix-memo" if self.name == "sgl_moe_no_memo" else "") + (
            " --http-server aiohttp" if self.name == "sgl_moe_aiohttp" else "") + (
            " --saturation-flops 1e30" if self.name == "sgl_moe_unqueued" else "") + (
            f" (baseline {self.source.name})" if self.source is not None else "") + (
            f" (python {self.python})" if self.python is not None else "")
        return base if self.front_processes == 1 else f"{base} --front-processes {self.front_processes}"

    def extra_args(self) -> list[str]:
        if self.engine != "sgl_moe":
            return []
        return ["--log-level", "warning", *(["--no-prefix-memo"] if self.name == "sgl_moe_no_memo" else []),
                *(["--http-server", "aiohttp"] if self.name == "sgl_moe_aiohttp" else []),
                *(["--saturation-flops", "1e30"] if self.name == "sgl_moe_unqueued" else []),
                *(["--front-processes", str(self.front_processes)] if self.front_processes > 1 else [])]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _errors(records: list[Record]) -> tuple[int, str | None]:
    bad = [r for r in records if r.status != 200]
    return len(bad), (f"{bad[0].status}: {bad[0].error}"[:300] if bad else None)


async def measure(url: str, stream: Stream, concurrency: int, cpu, stand_ins: StandIns, owner_cpu=None,
                  counter: callgrind.Counter | None = None, tables: bool = False) -> dict:
    """Warm-up, then the measured window with ``cpu()`` (the router's (user, system) CPU seconds) read on both sides;
    ``owner_cpu()``: the placement owner's alone (sgl_moe with front processes); ``counter``: the router's
    instructions over the window (it runs under callgrind); ``tables``: sgl_moe's, whose blocks stored by KV events
    are read on both sides too (``events_stored_in_window``: the event work inside the window)."""
    warm, _ = await run_stream(url, stream.warmup, concurrency, progress=False) if stream.warmup else ([], 0.0)
    e0 = await block_tables(url) if tables else None
    g0 = await gc_counts(url) if tables else None
    c0, s0, o0 = cpu(), stand_ins.cpu_seconds(), own_cpu_seconds()
    w0 = owner_cpu() if owner_cpu is not None else None
    with counter.window(stream.name) if counter is not None else nullcontext([]) as counted:
        records, wall = await run_stream(url, stream.measured, concurrency, progress=False)
    c1, s1, o1 = cpu(), stand_ins.cpu_seconds(), own_cpu_seconds()
    w1 = owner_cpu() if owner_cpu is not None else None
    e1 = await block_tables(url) if tables else None
    g1 = await gc_counts(url) if tables else None
    n = len(records)
    errors, first_error = _errors(records)
    warm_errors, warm_first = _errors(warm)
    out = {"requests": n, "errors": errors, "warmup_errors": warm_errors, "first_error": first_error or warm_first,
           "wall_s": wall, "req_per_s": n / wall if wall > 0 else 0.0,
           "latencies_ms": [r.latency_s * 1e3 for r in records],
           "client_cpu_ms_per_request": (o1 - o0) / n * 1e3 if n else None,
           "stand_in_cpu_ms_per_request": (s1 - s0) / n * 1e3 if n and s0 is not None and s1 is not None else None}
    if c0 is not None and c1 is not None and n:
        out["cpu_s"] = sum(c1) - sum(c0)
        out["cpu_ms_per_request"] = out["cpu_s"] / n * 1e3
        out["user_cpu_s"], out["system_cpu_s"] = c1[0] - c0[0], c1[1] - c0[1]
    if w0 is not None and w1 is not None and n:
        out["owner_cpu_s"] = w1 - w0
    if e0 is not None and e1 is not None:
        out["events_stored_in_window"] = e1["events_stored"] - e0["events_stored"]
    if g0 is not None and g1 is not None:
        out["gc_passes_in_window"] = g1[0] - g0[0]
        out["gc_objects_collected_in_window"] = g1[1] - g0[1]
    if counted and n:
        out["instructions"] = counted[0]
        out["instructions_per_request"] = counted[0] / n
        out["instructions_by_object"] = callgrind.by_object(counter.last_dump)
    return out


async def run_router(spec: RouterSpec, stand_ins: StandIns, stream: Stream, concurrency: int, log_dir: Path,
                     rep: int, instructions: bool = False) -> dict:
    log = log_dir / f"{spec.label.replace(' ', '_').replace('/', '_')}-{stream.name}-{rep}.log"
    counted = log.with_suffix(".callgrind") if instructions else None
    if counted:
        callgrind.clear(counted)  # a rerun into the same --log-dir
    router = RouterUnderTest(spec.policy, stand_ins.urls, log, extra_args=spec.extra_args(), engine=spec.engine,
                             source=spec.source, python=spec.python,
                             wrap=callgrind.command(counted) if counted else None)
    try:
        try:
            await asyncio.to_thread(router.start, INSTRUMENTED_START_S if instructions else 120)
        except Exception as exc:  # noqa: BLE001 - RouterStartError / RuntimeError: the log says why
            reason = _last_log_line(log) or str(exc).splitlines()[0]
            if spec.front_processes > 1:
                return {"available": False, "reason": reason}
            raise BenchError(f"{spec.label} did not start: {reason} (log: {log})") from None
        owner = router.top_cpu_seconds if spec.front_processes > 1 else None
        counter = callgrind.Counter(router.pid, counted) if counted else None
        out = {"available": True, **await measure(router.url, stream, concurrency, router.cpu_times, stand_ins,
                                                  owner, counter, tables=spec.engine == "sgl_moe")}
        if spec.engine == "sgl_moe":
            out["tables"] = await block_tables(router.url)
        return out
    finally:
        router.stop()


async def gc_counts(url: str) -> tuple[int, int] | None:
    """sgl_moe's router's cyclic garbage collector so far, from its ``/metrics`` (``python_gc_*``, every generation):
    (passes, objects collected); None where the router does not expose them (a baseline older than 3f41480). A
    reference cycle left per request shows as objects collected growing with the requests, in the windows long
    enough to hold a pass (``tune_gc``'s threshold makes them rare)."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics", timeout=10) as resp:
            text = await resp.text()
    except Exception:  # noqa: BLE001 - a diagnostic only
        return None
    from prometheus_client.parser import text_string_to_metric_families

    totals = {f.name: int(sum(s.value for s in f.samples if s.name.endswith("_total")))
              for f in text_string_to_metric_families(text)
              if f.name in ("python_gc_collections", "python_gc_objects_collected")}
    if "python_gc_collections" not in totals:
        return None
    return totals["python_gc_collections"], totals.get("python_gc_objects_collected", 0)


async def block_tables(url: str) -> dict | None:
    """sgl_moe's tables at the end of a run, summed over its workers (``GET /workers``): committed and pending
    blocks, the blocks its KV events reported stored and removed, and the event streams' gaps (lost batches) and
    resets (a table emptied: lost batches not replayed, or a listener connecting) (the testbed's state, not a
    cost)."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/workers", timeout=10) as resp:
            workers = (await resp.json())["workers"]
    except Exception:  # noqa: BLE001 - a diagnostic only
        return None
    return {"committed_blocks": sum(w["committed_blocks"] for w in workers),
            "pending_blocks": sum(w["pending_blocks"] for w in workers),
            "events_stored": sum(w["counters"]["events_stored"] for w in workers),
            "events_removed": sum(w["counters"]["events_removed"] for w in workers),
            "event_gaps": sum(e["gaps"] for w in workers for e in w["events"]),
            "event_resets": sum(e["resets"] for w in workers for e in w["events"])}


def _last_log_line(path: Path) -> str | None:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    return lines[-1][:300] if lines else None


def pool(runs: list[dict]) -> dict:
    """The repeats of one (router, stream) together: sums over sums, percentiles over every latency."""
    ok = [r for r in runs if r.get("available", True)]
    if not ok:
        return {"available": False, "reason": runs[0].get("reason") if runs else None}
    n = sum(r["requests"] for r in ok)
    lat = [x for r in ok for x in r["latencies_ms"]]
    out = {"available": True, "requests": n, "errors": sum(r["errors"] for r in ok),
           "warmup_errors": sum(r["warmup_errors"] for r in ok),
           "first_error": next((r["first_error"] for r in ok if r["first_error"]), None),
           "req_per_s": n / sum(r["wall_s"] for r in ok), "p50_ms": pct(lat, 0.5) if lat else None,
           "p99_ms": pct(lat, 0.99) if lat else None}
    if all("cpu_s" in r for r in ok) and n:
        out["cpu_s"] = sum(r["cpu_s"] for r in ok)
        out["cpu_ms_per_request"] = out["cpu_s"] / n * 1e3
    if all("system_cpu_s" in r for r in ok) and n:  # the kernel's share: sockets, the same work for every router
        out["user_cpu_ms_per_request"] = sum(r["user_cpu_s"] for r in ok) / n * 1e3
        out["system_cpu_ms_per_request"] = sum(r["system_cpu_s"] for r in ok) / n * 1e3
    if all("instructions" in r for r in ok) and n:
        out["instructions_per_request"] = sum(r["instructions"] for r in ok) / n
        by_object: dict[str, int] = {}
        for r in ok:
            for name, count in r.get("instructions_by_object", {}).items():
                by_object[name] = by_object.get(name, 0) + count
        out["instructions_by_object"] = by_object
    if all("owner_cpu_s" in r for r in ok) and n:  # the one serial part: its CPU per request bounds req/s
        out["owner_cpu_ms_per_request"] = sum(r["owner_cpu_s"] for r in ok) / n * 1e3
        out["owner_bound_req_per_s"] = (1e3 / out["owner_cpu_ms_per_request"] if out["owner_cpu_ms_per_request"]
                                        else None)
    for key in ("client_cpu_ms_per_request", "stand_in_cpu_ms_per_request"):
        vals = [(r[key], r["requests"]) for r in ok if r.get(key) is not None]
        out[key] = sum(v * k for v, k in vals) / sum(k for _, k in vals) if vals else None
    out["flagged"] = bool(out["errors"] or out["warmup_errors"])
    out["repeats"] = [{k: v for k, v in r.items() if k != "latencies_ms"} |
                      ({"p50_ms": pct(r["latencies_ms"], 0.5), "p99_ms": pct(r["latencies_ms"], 0.99)}
                       if r.get("latencies_ms") else {}) for r in runs]
    return out


def run_order(entries: list, rep: int) -> list:
    """The order of repeat ``rep``: odd repeats reverse the even one before them (A B C, then C B A, so each router
    runs both before and after each other one); each pair of repeats starts one place further on. A rotation alone
    keeps every router's place relative to the others (A B C, B C A: A always before B)."""
    k = (rep // 2) % len(entries)
    order = entries[k:] + entries[:k]
    return order[::-1] if rep % 2 else order


async def run_all(args, specs: list[RouterSpec], streams: list[Stream], stand_ins: StandIns) -> dict:
    entries = [DIRECT, *specs]
    raw: dict[tuple[str, str], list[dict]] = {}
    total, k = args.repeats * len(streams) * len(entries), 0
    for rep in range(args.repeats):
        order = run_order(entries, rep)
        for stream in streams:
            if rep == 0 and args.warm_up_run:
                await stand_ins.flush()
                r = await run_router(specs[0], stand_ins, stream, args.concurrency, args.log_dir, -1, False)
                print(f"[warm-up] {stream.name:<12} {specs[0].label:<48} "
                      + (_progress(r) if r["available"] else f"not available: {r['reason']}"),
                      file=sys.stderr, flush=True)
            for entry in order:
                k += 1
                await stand_ins.flush()
                if entry == DIRECT:
                    name = DIRECT
                    # Round-robin straight over the stand-ins is what a router's cheapest forwarding does;
                    # run_stream takes one URL, and every stand-in lives in the same process: send to the first.
                    r = {"available": True, **await measure(stand_ins.urls[0], stream, args.concurrency,
                                                            lambda: None, stand_ins)}
                else:
                    name = entry.label
                    r = await run_router(entry, stand_ins, stream, args.concurrency, args.log_dir, rep,
                                         args.instructions)
                raw.setdefault((name, stream.name), []).append(r)
                print(f"[{k}/{total}] repeat {rep + 1}/{args.repeats}  {stream.name:<12} {name:<48} "
                      + (_progress(r) if r["available"] else f"not available: {r['reason']}"),
                      file=sys.stderr, flush=True)
    rows = []
    for (name, stream_name), runs in raw.items():
        rows.append({"router": name, "stream": stream_name, **pool(runs)})
    direct = {row["stream"]: row for row in rows if row["router"] == DIRECT}
    for row in rows:
        d = direct.get(row["stream"])
        if row["router"] != DIRECT and row["available"] and d and d.get("p50_ms") is not None \
                and row.get("p50_ms") is not None:
            row["direct_p50_ms"], row["direct_p99_ms"] = d["p50_ms"], d["p99_ms"]
            row["added_p50_ms"], row["added_p99_ms"] = row["p50_ms"] - d["p50_ms"], row["p99_ms"] - d["p99_ms"]
    order = {s.name: i for i, s in enumerate(streams)}
    labels = [DIRECT, *(s.label for s in specs)]
    rows.sort(key=lambda r: (order[r["stream"]], labels.index(r["router"])))
    return {"rows": rows, "ratios": ratios(rows, specs, streams),
            "instruction_ratios": ratios(rows, specs, streams, "instructions_per_request")}


def _progress(r: dict) -> str:
    cpu = f"CPU {r['cpu_ms_per_request']:.3f} ms/req  " if "cpu_ms_per_request" in r else ""
    lat = r["latencies_ms"]
    t = r.get("tables")
    tables = (f"  tables: {t['committed_blocks']:,} committed, {t['pending_blocks']:,} pending blocks "
              f"({t['events_stored']:,} stored by events, {r.get('events_stored_in_window', 0):,} in the measured "
              f"window; {t['event_gaps']} gaps, {t['event_resets']} resets)" if t else "")
    if "gc_passes_in_window" in r:
        tables += (f"  garbage collector: {r['gc_passes_in_window']} passes, {r['gc_objects_collected_in_window']:,} "
                   "objects collected in the measured window")
    return (f"{cpu}{r['req_per_s']:7.1f} req/s  p50 {pct(lat, 0.5):7.1f} ms  p99 {pct(lat, 0.99):7.1f} ms  "
            f"{r['errors'] + r['warmup_errors']} errors{tables}")


def ratios(rows: list[dict], specs: list[RouterSpec], streams: list[Stream], key: str = "cpu_ms_per_request"
           ) -> dict:
    """Per sgl_moe router row label: {stream: its ``key`` (CPU, or instructions, per request) / sglang-router
    cache_aware's}."""
    cpu = {(r["router"], r["stream"]): r.get(key) for r in rows if r["available"]}
    ca = RouterSpec("cache_aware", *ROUTERS["cache_aware"]).label
    out = {}
    for spec in specs:
        if spec.engine != "sgl_moe":
            continue
        for s in streams:
            a, b = cpu.get((spec.label, s.name)), cpu.get((ca, s.name))
            if a is not None and b:
                out.setdefault(spec.label, {})[s.name] = a / b
    return out


# -- output -------------------------------------------------------------------------------------------------------

def _f(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def table(result: dict) -> str:
    lines = ["| stream | router | CPU ms/req | user / kernel ms/req | owner ms/req (bound req/s) | req/s | p50 ms | "
             "p99 ms | added p50 ms | added p99 ms | errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if not r["available"]:
            lines.append(f"| {r['stream']} | {r['router']} | not available: {r['reason']} | | | | | | | | |")
            continue
        errors = r["errors"] + r["warmup_errors"]
        owner = (f"{r['owner_cpu_ms_per_request']:.3f} ({r['owner_bound_req_per_s']:.0f})"
                 if r.get("owner_bound_req_per_s") else "—")
        split = (f"{r['user_cpu_ms_per_request']:.3f} / {r['system_cpu_ms_per_request']:.3f}"
                 if r.get("system_cpu_ms_per_request") is not None else "—")
        lines.append(f"| {r['stream']} | {r['router']} | {_f(r.get('cpu_ms_per_request'), '.3f')} | {split} | "
                     f"{owner} | {r['req_per_s']:.0f} | {_f(r['p50_ms'], '.1f')} | {_f(r['p99_ms'], '.1f')} | "
                     f"{_f(r.get('added_p50_ms'), '.1f')} | {_f(r.get('added_p99_ms'), '.1f')} | "
                     f"{errors}{' **FLAGGED**' if errors else ''} |")
    for label, per_stream in result["cpu_ratio_vs_cache_aware"].items():
        lines.append("")
        lines.append(f"CPU per request, {label} / sglang-router cache_aware: "
                     + ", ".join(f"{s} {v:.2f}x" for s, v in per_stream.items()))
    counted = [r for r in result["rows"] if r.get("instructions_per_request")]
    if counted:
        lines += ["", "Instructions per request (the router under callgrind, over the measured window); the share "
                  "libcrypto ran (SHA-256 of the page hashes) is counted without the CPU's SHA instructions, which "
                  "callgrind does not emulate:", "",
                  "| stream | router | instructions/req | in libcrypto | outside libcrypto |",
                  "|---|---|---:|---:|---:|"]
        for r in counted:
            sha = sha_share(r.get("instructions_by_object", {}))
            lines.append(f"| {r['stream']} | {r['router']} | {r['instructions_per_request']:,.0f} | {sha:.1%} | "
                         f"{r['instructions_per_request'] * (1 - sha):,.0f} |")
        lines += ["", "Where those instructions ran (share of the window's, by the file whose code ran them; "
                  "files under 1% left out):", ""]
        lines += [f"- {r['stream']}, {r['router']}: {object_shares(r.get('instructions_by_object', {}))}"
                  for r in counted]
    for label, per_stream in result.get("instructions_ratio_vs_cache_aware", {}).items():
        lines.append("")
        lines.append(f"Instructions per request, {label} / sglang-router cache_aware: "
                     + ", ".join(f"{s} {v:.2f}x" for s, v in per_stream.items()))
    return "\n".join(lines)


def sha_share(by_object: dict[str, int]) -> float:
    """The share of ``callgrind.by_object``'s counts that ran in libcrypto (the page hashes' SHA-256).

    Under callgrind OpenSSL's SHA-256 runs without the SHA extensions (valgrind's emulated CPU does not report them:
    CPUID leaf 7 says ``sha=0`` under it, 1 on this VM's AMD EPYC), about 4,300 instructions a page; live, a page's
    hash costs 180-240 ns with them and 460-590 ns with them masked (``OPENSSL_ia32cap=":~0x20000000"``). libcrypto
    was 15-34% of the router's counted instructions and 2% of its live CPU samples (``perf``, unique-2000,
    2026-12-02): the count outside libcrypto is the router's without that distortion (the live SHA work is small,
    not zero)."""
    total = sum(by_object.values())
    return sum(v for k, v in by_object.items() if "libcrypto" in Path(k).name) / total if total else 0.0


def object_shares(by_object: dict[str, int], floor: float = 0.01) -> str:
    """``callgrind.by_object``'s counts as shares, largest first, each file by its name alone (``python3.11``,
    ``orjson``, ``native_word_pieces``, ``libc.so.6``)."""
    total = sum(by_object.values())
    if not total:
        return "—"
    shares = sorted(((count / total, _short_object(name)) for name, count in by_object.items()), reverse=True)
    return ", ".join(f"{name} {share:.1%}" for share, name in shares if share >= floor)


def _short_object(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.split(".cpython-")[0].split(".abi3.")[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routers", nargs="+", default=DEFAULT_ROUTERS, choices=list(ROUTERS),
                        help="sgl_moe (longest_block_match), sgl_moe_no_memo (the same, --no-prefix-memo), "
                             "sgl_moe_aiohttp (the same, --http-server aiohttp) and "
                             "sglang-router's cache_aware / round_robin")
    parser.add_argument("--prompt-tokens", nargs="+", type=int, default=[200, 2000, 4000])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--requests", type=int, default=1500, help="measured requests per (router, stream, repeat)")
    parser.add_argument("--warmup", type=int, default=200, help="requests sent first, not measured")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (closed loop)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of everything, the router order reversed every other repeat")
    parser.add_argument("--warm-up-run", action=argparse.BooleanOptionalAction, default=True,
                        help="run each stream once through the first router, unmeasured, before measuring it")
    parser.add_argument("--front-processes", nargs="+", type=int, default=[1],
                        help="sgl_moe's router once per N (``--front-processes N`` passed only when N > 1)")
    parser.add_argument("--stand-ins", type=int, default=4)
    parser.add_argument("--kv-events", action=argparse.BooleanOptionalAction, default=True,
                        help="the stand-ins keep a cache and publish its KV events, as sgl_moe's workers do "
                             "(default); --no-kv-events: none, every promise of sgl_moe's router lives out its TTL")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="a checkout of sgl_moe (e.g. `git worktree add DIR <commit>`) whose router runs as "
                             "sgl_moe_baseline (added to --routers) beside this one's, in the same run")
    parser.add_argument("--baseline-python", metavar="PYTHON",
                        help="the interpreter sgl_moe_baseline's router runs on (default: this one); with --baseline "
                             "naming this checkout, the same code on two builds of Python side by side")
    parser.add_argument("--allow-python-fallbacks", action="store_true",
                        help="measure a --baseline checkout whose C extensions do not import (a git worktree holds no "
                             "built .so files): it then runs their Python references. Refused by default")
    parser.add_argument("--instructions", action="store_true",
                        help="run every router under valgrind's callgrind and count its instructions per request over "
                             "the measured window (deterministic where CPU time on this VM is not; slow: use a few "
                             "hundred requests)")
    parser.add_argument("--log-dir", type=Path, default=Path(".work/logs/router_capacity"))
    parser.add_argument("--out", type=Path, help="write every figure as JSON")
    args = parser.parse_args(argv)
    args.log_dir = args.log_dir.resolve()  # a --baseline router runs from its own checkout: its files land here too
    for name in ("requests", "concurrency", "repeats", "stand_ins"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.instructions and not callgrind.available():
        parser.error("--instructions needs valgrind and callgrind_control (apt-get install valgrind)")
    for n in args.prompt_tokens:
        if not 20 <= n < CONTEXT_LENGTH:
            parser.error(f"--prompt-tokens must be between 20 and {CONTEXT_LENGTH - 1} (the stand-ins' context), "
                         f"got {n}")
    for n in args.front_processes:
        if n < 1:
            parser.error(f"--front-processes must be positive, got {n}")
    if args.baseline is not None:
        if not (args.baseline / "router" / "__main__.py").is_file():
            parser.error(f"--baseline {args.baseline}: not a checkout of sgl_moe (no router/__main__.py there)")
        args.baseline = args.baseline.resolve()
        if "sgl_moe_baseline" not in args.routers:
            args.routers = [*args.routers, "sgl_moe_baseline"]
    elif "sgl_moe_baseline" in args.routers:
        parser.error("sgl_moe_baseline needs --baseline DIR")
    if args.baseline_python is not None:
        if args.baseline is None:
            parser.error("--baseline-python needs --baseline DIR")
        if shutil.which(args.baseline_python) is None:
            parser.error(f"--baseline-python {args.baseline_python}: no such interpreter")
    if args.baseline is not None and not args.allow_python_fallbacks:
        why = native_modules.refusal(args.baseline, args.baseline_python)
        if why is not None:
            parser.error(f"--baseline {why}")
    args.prompt_tokens = list(dict.fromkeys(args.prompt_tokens))
    args.front_processes = list(dict.fromkeys(args.front_processes))
    return args


def router_specs(args) -> list[RouterSpec]:
    specs = []
    for name in dict.fromkeys(args.routers):
        engine, policy = ROUTERS[name]
        if engine == "sgl_moe":
            baseline = name == "sgl_moe_baseline"
            source, python = (args.baseline, args.baseline_python) if baseline else (None, None)
            specs += [RouterSpec(name, engine, policy, n, source, python) for n in args.front_processes]
        else:
            specs.append(RouterSpec(name, engine, policy))
    return specs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    try:
        return _main(args, argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _stop(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the router under test and the stand-ins are stopped on the way out (a terminated run left
    its router serving)."""
    raise KeyboardInterrupt


async def _until_sigterm(coro: Coroutine) -> object:
    """``coro``, cancelled on SIGTERM (its ``finally`` blocks stop the router under test), then KeyboardInterrupt."""
    task = asyncio.current_task()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await coro
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None


def _main(args: argparse.Namespace, argv: list[str] | None) -> int:
    specs = router_specs(args)
    if any(s.engine == "sglang-router" for s in specs):
        try:
            import sglang_router  # noqa: F401
        except ImportError:
            print("error: sglang-router is not installed in this environment (pip install sglang-router)",
                  file=sys.stderr)
            return 1
    filler = Filler()
    streams = []
    for tokens in args.prompt_tokens:
        for shape in args.shapes:
            t0 = time.perf_counter()
            streams.append(build_stream(filler, shape, tokens, args.warmup, args.requests, args.seed))
            s = streams[-1].summary()
            print(f"stream {streams[-1].name}: {s['warmup']} + {s['requests']} prompts of {s['tokens_min']}-"
                  f"{s['tokens_max']} tokens (built in {time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    stand_ins = StandIns(args.stand_ins, args.kv_events)
    try:
        stand_ins.start()
        print(f"{args.stand_ins} stand-in workers ({'publishing KV events' if args.kv_events else 'no KV events'}); "
              f"{len(specs)} routers x {len(streams)} streams x {args.repeats} "
              f"repeats, {args.warmup} + {args.requests} requests each at concurrency {args.concurrency}",
              file=sys.stderr, flush=True)
        result = asyncio.run(_until_sigterm(run_all(args, specs, streams, stand_ins)))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stand_ins.stop()
    out = {"machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version(),
                       "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None},
           "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv),
           "config": {"routers": [s.label for s in specs], "prompt_tokens": args.prompt_tokens,
                      "shapes": args.shapes, "requests": args.requests, "warmup": args.warmup,
                      "concurrency": args.concurrency, "repeats": args.repeats, "stand_ins": args.stand_ins,
                      "kv_events": args.kv_events, "warm_up_run": args.warm_up_run,
                      "front_processes": args.front_processes, "seed": args.seed,
                      "sampling_params": StreamUnit("", "", "", 0).body()["sampling_params"],
                      "latency": "client latency p50/p99 per router; direct = the same stream straight to a stand-in;"
                                 " added = router percentile - direct percentile"},
           "streams": {s.name: s.summary() for s in streams},
           "rows": result["rows"], "cpu_ratio_vs_cache_aware": result["ratios"],
           "instructions_ratio_vs_cache_aware": result["instruction_ratios"]}
    print(table(out))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    flagged = [f"{r['router']} / {r['stream']}" for r in out["rows"] if r.get("flagged")]
    if flagged:
        print(f"warning: requests failed in {', '.join(flagged)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
