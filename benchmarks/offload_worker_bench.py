"""Expert offload inside SGLang against unpatched SGLang, side by side on one machine (decode).

    .venv/bin/python benchmarks/offload_worker_bench.py --plain URL --worker exact=URL --worker speculative=URL

Every worker serves the same model; start the others with ``--moe-expert-offload --moe-execution {exact,
speculative,on_demand}``. Prompts are held-out windows of the shipped model's corpus (real text, so expert
prediction sees the distribution it was trained for). For each prompt and worker, in alternating order, one
request at a time: time to first token (``max_new_tokens`` 1) and the time of a greedy ``--new-tokens``
continuation; TPOT = (t_N − t_1) / (N − 1). Reports median TPOT and its ratio to plain, how many greedy tokens
equal plain's (and the mean position of the first difference), and the worker's offload counts from
``/sgl_moe/info`` (hits, misses after layer 0, experts copied, bytes moved; read before and after the run, each
time after a one-token request that makes the worker write them, so the run's counts include one such request).
On a CPU the host store and the
"device" buffer are both RAM: the timing is the engine's overhead, the counts are what carries to a GPU.

Smallest run (seconds once the workers are up; what CI runs): ``--prompts 2 --chars 200 --new-tokens 4``
(prompt 1 warms up, prompt 2 is timed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import httpx


def _generate(client: httpx.Client, url: str, text: str, new_tokens: int) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    r = client.post(f"{url}/generate", json={"text": text, "sampling_params": {
        "max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}})
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["output_ids"]


def _prompts(n: int, chars: int) -> list[str]:
    from sgl_moe.training.corpus import load_corpus

    docs = load_corpus().heldout
    out = []
    for doc in docs:
        for start in range(0, max(1, len(doc) - chars), chars * 3):
            out.append(doc[start:start + chars])
            if len(out) == n:
                return out
    return out


COUNTS_EVERY_S = 1.0
"""An offload worker writes its counts at the end of a forward, at most this often (``patches/expert_offload``)."""
FLUSH_TEXT = "Counts."
"""The one-token request that makes an offload worker write its counts (its own copies are counted with them)."""


def _offload_counts(client: httpx.Client, url: str) -> dict:
    """The worker's counts as of now: after a pause longer than its write interval, one one-token request, whose
    forward writes them (a run's last forwards may otherwise fall within a second of the last write, and no forward
    follows to write them)."""
    time.sleep(COUNTS_EVERY_S * 1.2)
    _generate(client, url, FLUSH_TEXT, 1)
    info = client.get(f"{url}/sgl_moe/info").json()
    return (info.get("offload") or {}).get("counts") or {}  # none: a worker started without --moe-expert-offload


def _measure(workers: dict[str, str], prompts: list[str], new_tokens: int):
    """Per worker: TPOT of each timed prompt, greedy tokens equal to plain's, first difference; offload counts
    before and after the run."""
    tpot: dict[str, list[float]] = {n: [] for n in workers}
    same: dict[str, list[int]] = {n: [] for n in workers}
    first_diff: dict[str, list[int]] = {n: [] for n in workers}
    with httpx.Client(timeout=600) as client:
        before = {n: _offload_counts(client, u) for n, u in workers.items() if n != "plain"}
        for i, text in enumerate(prompts):
            names = list(workers) if i % 2 else list(reversed(workers))
            outs = {}
            for name in names:
                t1, _ = _generate(client, workers[name], text, 1)
                tn, ids = _generate(client, workers[name], text, new_tokens)
                outs[name] = ids
                if i:  # prompt 0 warms up
                    tpot[name].append((tn - t1) / (new_tokens - 1))
            for name, ids in outs.items():
                ref = outs["plain"]
                same[name].append(sum(a == b for a, b in zip(ids, ref)))
                first_diff[name].append(next((j for j, (a, b) in enumerate(zip(ids, ref)) if a != b), len(ref)))
            print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
        after = {n: _offload_counts(client, u) for n, u in workers.items() if n != "plain"}
    return tpot, same, first_diff, before, after


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plain", required=True)
    p.add_argument("--worker", action="append", default=[], metavar="NAME=URL")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--chars", type=int, default=600)
    p.add_argument("--new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    if args.prompts < 2 or args.new_tokens < 2 or args.chars < 1:
        p.error("--prompts and --new-tokens must be at least 2 (the first prompt warms up; TPOT needs two tokens), "
                "--chars at least 1")
    if any("=" not in w or w.startswith(("=", "plain=")) for w in args.worker):
        p.error(f"--worker takes NAME=URL with a name other than 'plain', got {args.worker}")
    workers = {"plain": args.plain} | dict(w.split("=", 1) for w in args.worker)
    prompts = _prompts(args.prompts, args.chars)
    try:
        tpot, same, first_diff, before, after = _measure(workers, prompts, args.new_tokens)
    except (httpx.RequestError, httpx.HTTPStatusError) as exc:  # a worker not up, or refusing: one line
        print(f"offload_worker_bench: {exc.request.url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    base = statistics.median(tpot["plain"])
    print(f"{len(prompts)} held-out prompts of {args.chars} chars, {args.new_tokens} greedy tokens each (TPOT over "
          f"the last {len(prompts) - 1}: the first warms up); counts are differences of /sgl_moe/info over the run "
          "and one one-token request after it\n")
    print("| worker | median TPOT ms | / plain | tokens equal to plain | mean first difference at | "
          "decode hits / misses, layers >= 1 | experts copied | MB moved |")
    print("|---|---|---|---|---|---|---|---|")
    total = args.new_tokens * len(prompts)
    for name in workers:
        m = statistics.median(tpot[name])
        d = {k: after.get(name, {}).get(k, 0) - before.get(name, {}).get(k, 0)
             for k in ("hits_after_layer0", "misses_after_layer0", "experts_copied", "bytes_moved")}
        counts = (f"{d['hits_after_layer0']} / {d['misses_after_layer0']} | {d['experts_copied']} | "
                  f"{d['bytes_moved'] / 1e6:.1f}"
                  if name != "plain" else "- | - | -")
        print(f"| {name} | {m * 1e3:.2f} | {m / base:.3f} | {sum(same[name])}/{total} | "
              f"{statistics.mean(first_diff[name]):.1f} | {counts} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
