"""Router replicas: 1 router, then N replicas alone, N replicas placing on tables shared through NATS (``--peers
--replica-placement shared``) and N replicas with one placement owner (``--peers``, its default
``--replica-placement owner``), on the same stream against the same kind of workers, requests spread round-robin
across the replicas.

    .venv/bin/python benchmarks/replicas_bench.py [--replicas 2 4] [--workers 3] [--requests 240] [--clients 24]
        [--groups 24] [--prefix-tokens 256] [--suffix-tokens 32] [--pool-tokens 3072] [--theta-requests 4]
        [--per-token-s 1e-3] [--kill-replica] [--repeats 1] [--seed 0] [--out FILE.json]

Smallest run (what the test runs): ``--replicas 2 --requests 24 --clients 4 --groups 4``.

The configurations run in the order listed, then (``--repeats 2``) again in reverse, and so on; rows are per run.

Workers: stand-ins (``sgl_moe.policy_bench.standin``, served from a thread of this script) that take
``--per-token-s`` per computed token, one batch at a time, and keep an LRU prefix cache of ``--pool-tokens``; fresh
for every configuration. Every router has Θ pinned to ``--theta-requests`` full requests of FLOPs and no request
overhead, so admission is the same arithmetic everywhere. The broker is ``tools/nats_server.sh``.

Stream: ``policy_bench``'s shared-prefix stream (Zipf-popular groups), ``--clients`` closed-loop clients, client
``i`` sending to replica ``i mod N``.

Figures per configuration:

* **req/s** and the **cached fraction** the workers reported (cached tokens over prompt tokens);
* **Θ overcommit**: every 20 ms each replica's ``GET /workers`` is read and, per worker, the replicas' own in-flight
  FLOPs (``inflight_flops - peer_inflight_flops``) are summed; the largest sum over Θ (1.0: exactly at Θ), how far
  past Θ that is in full requests (one router admits while below Θ, so it passes Θ by less than one), and the share
  of samples with some worker past Θ by more than one request;
* **load CoV**: the coefficient of variation across workers of those sums, averaged over the samples with load;
* **failed first try / lost after one retry**: a client whose request fails (its replica gone, or a 5xx) resends it
  once to the next replica and stays there. With ``--kill-replica`` each peers configuration runs again with its
  last replica SIGKILLed when half the stream has been sent (load sampled on the survivors), and the survivors'
  time to drop the dead replica's promises and load is reported (``--peer-timeout-s`` of the routers, 5 s); the
  owner configuration also runs with its owner (``r0``, started first) SIGKILLed instead, and with the broker
  killed halfway and restarted 3 s later (on the same port): time until every replica is connected again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import httpx
import orjson

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.flops import FlopsModel
from sgl_moe.harness.router_process import RouterProcess
from sgl_moe.harness.worker_process import free_port
from sgl_moe.policy_bench.prefix_stream import PrefixStreamConfig, build_prefix_stream
from sgl_moe.policy_bench.standin import StandInFleet
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

REPO = Path(__file__).resolve().parents[1]


BROKER_DOWN_S = 3.0
"""How long the broker stays down in the broker-restart configurations."""


def start_broker(port: int, log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    proc = subprocess.Popen(["bash", str(REPO / "tools" / "nats_server.sh"), str(port)], stdout=out,
                            stderr=subprocess.STDOUT)
    out.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    raise SystemExit(f"the broker did not start: {log.read_text()[-2000:]}")


class Sampler:
    """Reads every replica's ``GET /workers`` every ``period_s`` in a thread: per worker URL, the replicas' own
    in-flight FLOPs summed."""

    def __init__(self, urls: list[str], theta: float, one_request: float, period_s: float = 0.02) -> None:
        self.urls, self.theta, self.one_request, self.period_s = urls, theta, one_request, period_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self._stop.is_set():
                total: dict[str, float] = {}
                try:
                    for url in self.urls:
                        for w in c.get(f"{url}/workers").json()["workers"]:
                            own = w["inflight_flops"] - w.get("peer_inflight_flops", 0.0)
                            total[w["url"]] = total.get(w["url"], 0.0) + max(0.0, own)
                except (httpx.HTTPError, ValueError, KeyError):
                    continue
                self.samples.append(total)
                time.sleep(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def summary(self) -> dict[str, float]:
        loaded = [s for s in self.samples if sum(s.values()) > 0]
        peak = max((v for s in self.samples for v in s.values()), default=0.0)
        past = sum(any(v > self.theta + self.one_request * 1.001 for v in s.values()) for s in loaded)
        covs = [statistics.pstdev(s.values()) / statistics.fmean(s.values()) for s in loaded if len(s) > 1]
        return {"samples": len(self.samples), "max_load_over_theta": peak / self.theta,
                "max_overcommit_requests": max(0.0, peak - self.theta) / self.one_request,
                "share_past_theta_plus_one": past / len(loaded) if loaded else 0.0,
                "load_cov": statistics.fmean(covs) if covs else 0.0}


async def drive(urls: list[str], bodies: list[bytes], clients: int, kill_at: int | None = None,
                kill=None) -> tuple[list[tuple[int, int, int]], float, int]:
    """Closed loop; client ``i`` sends to ``urls[i % len(urls)]``. (status, prompt tokens, cached tokens) each, the
    wall time, and how many requests failed on their first try. A request that fails (the replica is gone, or
    answered 5xx) is retried once on the next replica, which that client then keeps (a client's retry). ``kill``
    is called once ``kill_at`` requests have been sent."""
    out: list[tuple[int, int, int]] = []
    nxt = 0
    first_failures = 0
    t0 = time.perf_counter()

    async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes]:
        try:
            async with session.post(f"{url}/generate", data=body,
                                    headers={"content-type": "application/json"}) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            return 0, b""

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        nonlocal nxt, first_failures
        at = i % len(urls)
        while nxt < len(bodies):
            body = bodies[nxt]
            nxt += 1
            if kill is not None and nxt == kill_at:
                kill()
            status, payload = await post(session, urls[at], body)
            if status == 0 or status >= 500:
                first_failures += 1
                at = (at + 1) % len(urls)
                status, payload = await post(session, urls[at], body)
            if status != 200:
                out.append((status, 0, 0))
                continue
            meta = orjson.loads(payload).get("meta_info", {})
            out.append((200, int(meta.get("prompt_tokens", 0)), int(meta.get("cached_tokens", 0))))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(i, session) for i in range(clients)))
    return out, time.perf_counter() - t0, first_failures


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def watch_drop(url: str, replica: str, killed: dict[str, float]) -> None:
    """Record when the router at ``url`` stops listing ``replica`` among its peers."""
    with httpx.Client(timeout=5) as c:
        while time.monotonic() - killed["at"] < 60:
            try:
                if replica not in c.get(f"{url}/workers").json()["peers"]["replicas"]:
                    killed["dropped_after_s"] = time.monotonic() - killed["at"]
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)


def wait_synced(routers: list[RouterProcess], timeout: float = 30.0) -> None:
    names = {f"r{i}" for i in range(len(routers))}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = [httpx.get(f"{r.url}/workers", timeout=5).json()["peers"] for r in routers]
        if all(v["state"] == "connected" and
               {k for k, p in v["replicas"].items() if p["synced"]} >= names - {v["replica"]} for v in views):
            return
        time.sleep(0.1)
    raise SystemExit("the replicas did not see each other through the broker in time")


class Broker:
    """The broker, which a configuration may restart mid-stream (on the same port)."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.proc = start_broker(port, log)

    def restart_after(self, down_s: float) -> None:
        self.proc.kill()
        self.proc.wait(10)
        time.sleep(down_s)
        self.proc = start_broker(self.port, self.log)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def watch_reconnect(urls: list[str], marks: dict[str, float]) -> None:
    """Record when every router at ``urls`` is connected to the broker again (after ``marks["at"]``)."""
    time.sleep(0.5)
    with httpx.Client(timeout=5) as c:
        while time.monotonic() - marks["at"] < 60:
            try:
                if all(c.get(f"{u}/workers").json()["peers"]["state"] == "connected" for u in urls):
                    marks["reconnected_after_s"] = time.monotonic() - marks["at"]
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)


def run_config(name: str, replicas: int, peers: str | None, args, bodies: list[bytes], theta: float,
               one_request: float, log_dir: Path, placement: str = "owner", kill: int | None = None,
               broker: Broker | None = None) -> dict:
    """One configuration on fresh stand-ins; ``kill``: the index of the replica SIGKILLed halfway through;
    ``broker``: restarted halfway through instead (down ``BROKER_DOWN_S``)."""
    kill_one = kill is not None
    with StandInFleet(args.workers, args.pool_tokens, per_token_s=args.per_token_s, step_s=0.0) as fleet:
        routers = []
        try:
            for i in range(replicas):
                extra = ["--saturation-flops", repr(theta), "--request-overhead-flops", "0"]
                if peers is not None:
                    extra += ["--peers", peers, "--peers-cluster", slug(name), "--replica-name", f"r{i}",
                              "--replica-placement", placement]
                r = RouterProcess(log_path=log_dir / f"{slug(name)}-r{i}.log", worker_urls=fleet.urls,
                                  args=extra)
                routers.append(r.start())
                time.sleep(0.2)  # r0 starts first: with one placement owner, it is r0
            for r in routers:
                r.wait_ready(timeout=120)
            if peers is not None:
                wait_synced(routers)
            killed: dict[str, float] = {}
            urls = [r.url for r in routers]

            survivors = [u for i, u in enumerate(urls) if i != kill]

            def kill_replica() -> None:  # SIGKILLed mid-stream; a survivor is watched until it drops it
                killed["at"] = time.monotonic()
                os.killpg(routers[kill].proc.pid, signal.SIGKILL)
                threading.Thread(target=watch_drop, args=(survivors[0], f"r{kill}", killed), daemon=True).start()

            def restart_broker() -> None:
                killed["at"] = time.monotonic()

                def run() -> None:
                    broker.restart_after(BROKER_DOWN_S)
                    watch_reconnect(urls, killed)
                threading.Thread(target=run, daemon=True).start()

            fault = kill_replica if kill_one else restart_broker if broker is not None else None
            with Sampler(survivors, theta, one_request) as sampler:
                records, wall, first_failures = asyncio.run(drive(
                    urls, bodies, args.clients, kill_at=len(bodies) // 2 if fault else None, kill=fault))
            if broker is not None:
                deadline = time.monotonic() + 60
                while "reconnected_after_s" not in killed and time.monotonic() < deadline:
                    time.sleep(0.1)
            if kill_one:
                deadline = time.monotonic() + 30
                while "dropped_after_s" not in killed and time.monotonic() < deadline:
                    time.sleep(0.1)
        finally:
            for r in routers:
                r.stop()
    ok = [r for r in records if r[0] == 200]
    prompt, cached = sum(r[1] for r in ok), sum(r[2] for r in ok)
    row = {"config": name, "replicas": replicas, "peers": peers is not None,
           "placement": placement if peers is not None else None, "requests": len(records),
           "errors": len(records) - len(ok), "req_per_s": len(ok) / wall, "cached_fraction": cached / max(1, prompt),
           "first_try_failures": first_failures, **sampler.summary()}
    if kill_one:
        row["killed_replica_dropped_after_s"] = killed.get("dropped_after_s")
    if broker is not None:
        row["broker_down_s"] = BROKER_DOWN_S
        row["reconnected_after_s"] = killed.get("reconnected_after_s")
    print(f"[{name}] {row['req_per_s']:.1f} req/s, cached {row['cached_fraction']:.3f}, max load "
          f"{row['max_load_over_theta']:.2f} Θ, load CoV {row['load_cov']:.2f}, errors {row['errors']}",
          file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", nargs="+", type=int, default=[2, 4])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--groups", type=int, default=24)
    p.add_argument("--prefix-tokens", type=int, default=256)
    p.add_argument("--suffix-tokens", type=int, default=32)
    p.add_argument("--pool-tokens", type=int, default=3072)
    p.add_argument("--theta-requests", type=float, default=4.0, help="Θ in full requests of FLOPs")
    p.add_argument("--per-token-s", type=float, default=1e-3, help="stand-in seconds per computed token")
    p.add_argument("--kill-replica", action="store_true",
                   help="also run each peers configuration with its last replica SIGKILLed halfway through the stream, "
                        "the owner configuration with its owner killed, and with the broker restarted")
    p.add_argument("--repeats", type=int, default=1, help="runs of every configuration, the order reversed each time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, default=Path(".work/logs/replicas_bench"))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    for name in ("workers", "requests", "clients", "groups", "prefix_tokens", "suffix_tokens", "pool_tokens",
                 "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if any(n < 2 for n in args.replicas):
        p.error("--replicas lists replica counts of 2 or more (one router always runs first)")
    args.log_dir.mkdir(parents=True, exist_ok=True)

    tok = RouterTokenizer.from_dir(DEFAULT_MODEL_DIR)
    units = build_prefix_stream(PrefixStreamConfig(args.requests, args.groups, args.prefix_tokens,
                                                   args.suffix_tokens, seed=args.seed), tok)
    bodies = [orjson.dumps(u.body()) for u in units]
    flops = FlopsModel.from_hf_config(json.loads((DEFAULT_MODEL_DIR / "config.json").read_text()))
    one_request = flops.request_flops(0, args.prefix_tokens + args.suffix_tokens)
    theta = args.theta_requests * one_request

    port = free_port("127.0.0.1")
    broker = Broker(port, args.log_dir / "nats.log")
    peers = f"nats://127.0.0.1:{port}"
    configs = [("1 router", 1, None, {})]
    for n in args.replicas:
        configs += [(f"{n} alone", n, None, {}), (f"{n} shared", n, peers, {"placement": "shared"}),
                    (f"{n} owner", n, peers, {"placement": "owner"})]
        if args.kill_replica:
            configs += [(f"{n} shared, one killed", n, peers, {"placement": "shared", "kill": n - 1}),
                        (f"{n} owner, a follower killed", n, peers, {"placement": "owner", "kill": n - 1}),
                        (f"{n} owner, the owner killed", n, peers, {"placement": "owner", "kill": 0}),
                        (f"{n} owner, broker restarted", n, peers, {"placement": "owner", "broker": broker})]
    rows = []
    try:
        for rep_i in range(args.repeats):
            for name, n, via, kw in (configs if rep_i % 2 == 0 else configs[::-1]):
                rows.append(run_config(name, n, via, args, bodies, theta, one_request, args.log_dir, **kw))
                rows[-1]["repeat"] = rep_i
    finally:
        broker.stop()

    print("| routers | req/s | cached fraction | max load / Θ | past Θ by (requests) | samples past Θ + 1 request "
          "| load CoV | failed first try | lost after one retry |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['req_per_s']:.1f} | {r['cached_fraction']:.3f} | {r['max_load_over_theta']:.2f} | "
              f"{r['max_overcommit_requests']:.1f} | {r['share_past_theta_plus_one']:.1%} | {r['load_cov']:.2f} | "
              f"{r['first_try_failures']} | {r['errors']} |")
    for r in rows:
        if "reconnected_after_s" in r:
            after = r["reconnected_after_s"]
            print(f"\n{r['config']}: down {r['broker_down_s']:g} s; every replica connected again "
                  + (f"{after:.1f} s after the kill" if after is not None else "not within 60 s"))
        if "killed_replica_dropped_after_s" in r:
            after = r["killed_replica_dropped_after_s"]
            print(f"\n{r['config']}: the survivors dropped the killed replica's promises and load "
                  + (f"{after:.1f} s after the kill" if after is not None else "not within 60 s"))
    if args.out:
        args.out.write_text(json.dumps({
            "command": "benchmarks/replicas_bench.py " + shlex.join(sys.argv[1:] if argv is None else argv),
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "theta_flops": theta, "one_request_flops": one_request, "rows": rows}, indent=1))
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
