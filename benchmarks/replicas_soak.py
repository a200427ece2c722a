"""Soak: locust at saturation through router replicas (``--peers``, one placement owner) for ``--duration-s``, while
every ``--period-s`` one worker and one replica are SIGKILLed and restarted ``--restart-after-s`` later (the
workers and the replicas in turn).

    .venv/bin/python benchmarks/replicas_soak.py [--duration-s 1800] [--period-s 300] [--replicas 2] [--workers 3]
        [--users 24] [--restart-after-s 10] [--out FILE.json]

Smallest run (what the test runs): ``--duration-s 40 --period-s 15 --restart-after-s 3 --users 4``.

Workers: stand-ins (``sgl_moe.policy_bench.standin``, ``--per-token-s`` per computed token, ``--pool-tokens`` LRU
prefix caches), each its own process on a fixed port so that a restarted one is the same URL; routers: ``python -m
sgl_moe.router`` with ``--peers`` on a broker started by ``tools/nats_server.sh``, Θ pinned at ``--theta-requests``
full requests; load: ``locust`` headless with ``benchmarks/replicas_soak_locust.py`` (user ``i`` on replica ``i mod
N``; a failed request is resent once to the next replica), ``policy_bench``'s Zipf shared-prefix stream.

Reported: requests, first tries that failed and when (each set against the kill it followed), requests lost after
one retry, req/s per period, and the resident memory (RSS) of every process: per incarnation, its first sample after
``--settle-s`` and its last, so a leak shows as growth within an incarnation; the broker and locust are never
restarted and show the whole run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import psutil

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.flops import FlopsModel
from sgl_moe.harness.router_process import RouterProcess
from sgl_moe.harness.worker_process import free_port
from sgl_moe.policy_bench.prefix_stream import PrefixStreamConfig, build_prefix_stream
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from replicas_bench import start_broker  # noqa: E402  (a sibling script)


def serve_worker(port: int, pool_tokens: int, per_token_s: float) -> None:
    """``--serve-worker PORT``: one stand-in on ``port`` until killed."""
    from sgl_moe.policy_bench.standin import StandInFleet

    fleet = StandInFleet(1, pool_tokens, per_token_s=per_token_s, step_s=0.0)
    fleet.workers[0].port = port
    fleet.start()
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    fleet.stop()


@dataclass
class Proc:
    """One long-lived part of the soak, restarted after each kill; its RSS samples per incarnation."""

    name: str
    start: object
    """() -> psutil-trackable pid."""
    pid: int = 0
    incarnations: list[dict] = field(default_factory=list)

    def launch(self) -> None:
        self.pid = self.start()
        self.incarnations.append({"pid": self.pid, "started": time.time(), "rss_mb": []})

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.incarnations[-1]["killed"] = time.time()

    def sample(self, settle_s: float) -> None:
        inc = self.incarnations[-1]
        if "killed" in inc or time.time() - inc["started"] < settle_s:
            return
        try:
            p = psutil.Process(self.pid)
            rss = p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
        except psutil.Error:
            return
        inc["rss_mb"].append(round(rss / 2**20, 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=1800)
    p.add_argument("--period-s", type=float, default=300)
    p.add_argument("--restart-after-s", type=float, default=10)
    p.add_argument("--settle-s", type=float, default=30, help="RSS is sampled from this long after each start")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--users", type=int, default=24)
    p.add_argument("--requests", type=int, default=2000, help="distinct request bodies, sent in turn")
    p.add_argument("--groups", type=int, default=24)
    p.add_argument("--prefix-tokens", type=int, default=256)
    p.add_argument("--suffix-tokens", type=int, default=32)
    p.add_argument("--pool-tokens", type=int, default=3072)
    p.add_argument("--theta-requests", type=float, default=4.0)
    p.add_argument("--per-token-s", type=float, default=1e-3)
    p.add_argument("--log-dir", type=Path, default=Path(".work/logs/replicas_soak"))
    p.add_argument("--out", type=Path)
    p.add_argument("--serve-worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_worker is not None:
        serve_worker(args.serve_worker, args.pool_tokens, args.per_token_s)
        return 0
    if args.replicas < 2 or args.workers < 2:
        p.error("--replicas and --workers must be at least 2 (one of each is killed at a time)")
    if not 0 < args.restart_after_s < args.period_s <= args.duration_s:
        p.error("need 0 < --restart-after-s < --period-s <= --duration-s")
    args.log_dir.mkdir(parents=True, exist_ok=True)

    tok = RouterTokenizer.from_dir(DEFAULT_MODEL_DIR)
    units = build_prefix_stream(PrefixStreamConfig(args.requests, args.groups, args.prefix_tokens,
                                                   args.suffix_tokens, seed=0), tok)
    bodies = tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False)  # noqa: SIM115
    for u in units:
        bodies.write(orjson.dumps(u.body()) + b"\n")
    bodies.close()
    flops = FlopsModel.from_hf_config(json.loads((DEFAULT_MODEL_DIR / "config.json").read_text()))
    theta = args.theta_requests * flops.request_flops(0, args.prefix_tokens + args.suffix_tokens)

    broker_port = free_port("127.0.0.1")
    broker = start_broker(broker_port, args.log_dir / "nats.log")
    worker_ports = [free_port("127.0.0.1") for _ in range(args.workers)]
    worker_urls = [f"http://127.0.0.1:{port}" for port in worker_ports]
    router_ports = [free_port("127.0.0.1") for _ in range(args.replicas)]
    router_urls = [f"http://127.0.0.1:{port}" for port in router_ports]
    procs: list[Proc] = []

    def worker_starter(i: int):
        def start() -> int:
            log = open(args.log_dir / f"worker{i}.log", "ab")  # noqa: SIM115 (handed to the child)
            child = subprocess.Popen([sys.executable, __file__, "--serve-worker", str(worker_ports[i]),
                                      "--pool-tokens", str(args.pool_tokens), "--per-token-s", str(args.per_token_s)],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            return child.pid
        return start

    def router_starter(i: int):
        def start() -> int:
            r = RouterProcess(log_path=args.log_dir / f"r{i}-{int(time.time())}.log", worker_urls=worker_urls,
                              port=router_ports[i],
                              args=["--saturation-flops", repr(theta), "--request-overhead-flops", "0",
                                    "--peers", f"nats://127.0.0.1:{broker_port}", "--replica-name", f"r{i}"])
            r.start()
            return r.proc.pid
        return start

    workers = [Proc(f"worker{i}", worker_starter(i)) for i in range(args.workers)]
    routers = [Proc(f"r{i}", router_starter(i)) for i in range(args.replicas)]
    broker_proc = Proc("nats-server", lambda: broker.pid)
    procs = [*workers, *routers, broker_proc]
    locust_proc: Proc | None = None
    kills: list[dict] = []
    stop = threading.Event()
    try:
        for w in workers:
            w.launch()
        broker_proc.launch()
        for r in routers:
            r.launch()
            time.sleep(0.3)  # r0 is up longest: the placement owner
        wait_healthy(router_urls, 120)
        events = args.log_dir / "events.jsonl"
        events.write_text("")
        csv_prefix = args.log_dir / "locust"
        env = {**os.environ, "SOAK_REPLICAS": ",".join(router_urls), "SOAK_BODIES": bodies.name,
               "SOAK_EVENTS": str(events)}
        locust_log = open(args.log_dir / "locust.log", "wb")  # noqa: SIM115
        locust_proc = Proc("locust", lambda: subprocess.Popen(
            [sys.executable, "-m", "locust", "-f", str(REPO / "benchmarks" / "replicas_soak_locust.py"), "--headless",
             "-u", str(args.users), "-r", str(args.users), "-t", f"{int(args.duration_s)}s", "--csv", str(csv_prefix),
             "--csv-full-history", "--only-summary", "--stop-timeout", "30"],
            env=env, stdout=locust_log, stderr=subprocess.STDOUT, start_new_session=True).pid)
        locust_proc.launch()
        procs.append(locust_proc)
        t0 = time.time()
        print(f"soak: {args.duration_s:.0f} s, {args.users} users over {args.replicas} replicas, {args.workers} "
              f"workers; a worker and a replica killed every {args.period_s:.0f} s", file=sys.stderr, flush=True)

        def sampler() -> None:
            while not stop.is_set():
                for proc in procs:
                    proc.sample(args.settle_s)
                stop.wait(5)

        threading.Thread(target=sampler, daemon=True).start()
        round_no = 0
        while True:
            next_kill = t0 + (round_no + 1) * args.period_s
            if next_kill + args.restart_after_s >= t0 + args.duration_s - 5:
                break
            time.sleep(max(0.0, next_kill - time.time()))
            w, r = workers[round_no % len(workers)], routers[round_no % len(routers)]
            for proc in (w, r):
                proc.sample(0)  # its last sample before the kill
                proc.kill()
            kill = {"round": round_no, "at": time.time() - t0, "worker": w.name, "replica": r.name}
            print(f"[{kill['at']:.0f} s] killed {w.name} and {r.name}", file=sys.stderr, flush=True)
            time.sleep(args.restart_after_s)
            w.launch()
            r.launch()
            kill["restarted_at"] = time.time() - t0
            kills.append(kill)
            round_no += 1
        psutil.Process(locust_proc.pid).wait(args.duration_s + 120 - (time.time() - t0))
        for proc in procs:
            proc.sample(args.settle_s)  # the last sample of each
    finally:
        stop.set()
        for proc in procs:
            if proc is not broker_proc and proc is not locust_proc:
                proc.kill()
        broker.kill()
        os.unlink(bodies.name)
    result = summarise(args, argv, t0, kills, procs, csv_prefix, events)
    print(result["table"])
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0 if result["lost"] == 0 and result["requests"] > 0 else 1


def wait_healthy(urls: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(httpx.get(f"{u}/health", timeout=2).status_code == 200 for u in urls):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the replicas did not become healthy in time")


def summarise(args, argv, t0: float, kills: list[dict], procs: list[Proc], csv_prefix: Path, events: Path) -> dict:
    rows = {r["Name"]: r for r in csv.DictReader(open(f"{csv_prefix}_stats.csv"))}
    first = rows.get("generate", {})
    retry = rows.get("generate retry", {})
    requests = int(first.get("Request Count", 0))
    evs = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    for e in evs:
        e["t"] -= t0
    window = args.restart_after_s + 15  # a kill's effect: the downtime and the clients moving over
    per_kill = []
    for n, k in enumerate(kills):
        end = min(k["at"] + window, kills[n + 1]["at"] - 1 if n + 1 < len(kills) else float("inf"))
        near = [e for e in evs if e["kind"] == "first_try" and k["at"] - 1 <= e["t"] < end]
        per_kill.append({**k, "first_try_failures": len(near),
                         "statuses": sorted({e["status"] for e in near})})
    explained = sum(k["first_try_failures"] for k in per_kill)
    first_failures = sum(e["kind"] == "first_try" for e in evs)
    lost = sum(e["kind"] == "lost" for e in evs)
    history = list(csv.DictReader(open(f"{csv_prefix}_stats_history.csv")))
    per_period = []
    for i in range(int(args.duration_s // args.period_s) + 1):
        lo, hi = t0 + i * args.period_s, t0 + (i + 1) * args.period_s
        done = [int(h["Total Request Count"]) for h in history
                if h["Name"] == "generate" and lo <= float(h["Timestamp"]) < hi]
        if len(done) > 1:
            per_period.append({"period": i, "req_per_s": (done[-1] - done[0]) / args.period_s})
    memory = []
    for proc in procs:
        for n, inc in enumerate(proc.incarnations):
            rss = inc["rss_mb"]
            if rss:
                memory.append({"process": proc.name, "incarnation": n, "first_mb": rss[0], "last_mb": rss[-1],
                               "max_mb": max(rss), "samples": len(rss),
                               "lived_s": round(inc.get("killed", time.time()) - inc["started"], 1)})
    lines = [f"requests {requests}, first tries failed {first_failures} ({explained} within {window:.0f} s of a "
             f"kill, up to the next), lost after one retry {lost} (locust's retry row: "
             f"{retry.get('Failure Count', 0)} failures)",
             "", "| kill at (s) | worker | replica | first tries failed | their statuses (0: no answer) |",
             "|---:|---|---|---:|---|"]
    lines += [f"| {k['at']:.0f} | {k['worker']} | {k['replica']} | {k['first_try_failures']} | "
              f"{', '.join(map(str, k['statuses']))} |" for k in per_kill]
    lines += ["", "| period | req/s |", "|---:|---:|"]
    lines += [f"| {p['period']} | {p['req_per_s']:.1f} |" for p in per_period]
    lines += ["", "| process | incarnation | lived (s) | RSS first (MB) | RSS last (MB) | max |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {m['process']} | {m['incarnation']} | {m['lived_s']:.0f} | {m['first_mb']:.1f} | {m['last_mb']:.1f} "
              f"| {m['max_mb']:.1f} |" for m in memory]
    return {"command": "benchmarks/replicas_soak.py " + shlex.join(sys.argv[1:] if argv is None else argv),
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()}, "requests": requests,
            "first_try_failures": first_failures, "explained_by_kills": explained, "lost": lost, "kills": per_kill,
            "per_period": per_period, "memory": memory, "table": "\n".join(lines)}


if __name__ == "__main__":
    sys.exit(main())
