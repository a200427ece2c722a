"""The main job on the embedded default: the router in front of two workers on the shipped model, then
a prefill-only demo through the router.

    python -m sgl_moe [--keep-running] [--port N] [--workers N] [worker flags ...]

Each demo prompt is classified by one prefill: SGLang's ``/v1/score`` returns the next-token
probability of each candidate label (single tokens), read from the logits; nothing is decoded.
The prompts share a prefix (a file header), which the worker computes once and then serves from its
prefix cache; the demo shows the cached-token counts SGLang reports.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

from sgl_moe.harness.worker_process import WorkerProcess, WorkerStartError, cpu_share, printed_progress, stop_all
from sgl_moe.wire import TOKENIZER_PATH

SHARED_PREFIX = '"""Utilities for working with files and paths."""\n\nimport os\nimport sys\n\n\n'
EXAMPLES: list[tuple[str, list[str]]] = [
    # (prompt, candidate labels); a label is one token, with its leading space where the text has one.
    ("class Reader:\n    def __init__(", ["self", "cls", "path"]),
    ("try:\n    import zlib\nexcept", [" ImportError", " ValueError", " OSError"]),
    ("def drain():\n    for line in sys.stdin:\n        sys.stdout.", ["write", "flush", "read"]),
    ("x = None\nif x is", [" None", " True", " not"]),
]


def _label_ids(tokenizer, labels: list[str]) -> list[int]:
    ids = []
    for label in labels:
        enc = tokenizer.encode(label, add_special_tokens=False).ids
        if len(enc) != 1:
            raise SystemExit(f"demo label {label!r} is not a single token of this tokenizer ({enc})")
        ids.append(enc[0])
    return ids


def fetch_tokenizer(worker_url: str):
    """The worker's tokenizer, read the way any client reads it: from the worker's public route (its info names
    the model folder by its base name only, which means nothing on this machine)."""
    from tokenizers import Tokenizer

    resp = httpx.get(worker_url + TOKENIZER_PATH, timeout=30.0)
    if resp.status_code != 200:
        raise SystemExit(f"GET {worker_url}{TOKENIZER_PATH} answered {resp.status_code}: {resp.text[:300]}")
    return Tokenizer.from_str(resp.text)


def run_demo(url: str, info: dict, tokenizer) -> None:
    print(f"\nworker: {info['model_name']} on {info['device']}, page size {info['page_size']}, "
          f"KV events {info['kv_events'][0]['endpoint'] if info['kv_events'] else 'off'}")
    print(f"FLOPs per prompt token: {info['flops']['linear_flops_per_token'] / 1e6:.2f} M linear "
          f"+ {info['flops']['attn_flops_per_pair']:.0f} per attended key; "
          f"saturation Θ = {info['saturation']['flops']:.3g} FLOPs ({info['saturation']['source']})\n")
    label_ids = [_label_ids(tokenizer, labels) for _, labels in EXAMPLES]
    with httpx.Client(base_url=url, timeout=120.0) as client:
        t0 = time.time()
        resp = client.post("/v1/score", json={
            "query": SHARED_PREFIX, "items": [prompt for prompt, _ in EXAMPLES],
            "label_token_ids": label_ids, "apply_softmax": True,
        })
        if resp.status_code != 200:
            raise SystemExit(f"/v1/score failed ({resp.status_code}): {resp.text[:500]}")
        scores = resp.json()["scores"]
        print(f"single-token classification of {len(EXAMPLES)} prompts sharing a prefix "
              f"(one /v1/score call, {time.time() - t0:.2f} s):")
        for (prompt, labels), probs in zip(EXAMPLES, scores):
            best = max(range(len(labels)), key=lambda i: probs[i])
            shown = "  ".join(f"{label.strip()}={p:.3f}" for label, p in zip(labels, probs))
            print(f"  ...{prompt.splitlines()[-1].strip()!r:<28} -> {labels[best].strip():<12} ({shown})")

        classify_demo(client)

        print("\nprefix cache: new prompts with the same file header, through /generate:")
        for i, body_text in enumerate(["def size(path):\n    return os.stat(path).st_size\n"] * 2 + [
                "def name(path):\n    return os.path.basename(path)\n"]):
            body = {"text": SHARED_PREFIX + body_text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
            resp = client.post("/generate", json=body)
            meta = resp.json()["meta_info"]
            routed = (f" -> worker {resp.headers['x-sgl-moe-worker']}, router predicted "
                      f"{resp.headers['x-sgl-moe-predicted-cached-tokens']} cached"
                      if "x-sgl-moe-worker" in resp.headers else "")
            print(f"  request {i + 1}: {meta['prompt_tokens']} prompt tokens, {meta['cached_tokens']} served from "
                  f"the prefix cache{routed}")
            time.sleep(0.2)  # let the worker's KV events reach the router


def classify_demo(client: httpx.Client) -> None:
    """The router's prefill-only API: a single choice and a multi-selection (siblings sharing a prefix)."""
    doc = SHARED_PREFIX + "def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n\n"
    body = {"inputs": [
        {"id": "choice", "type": "choice", "prompt": doc + "# Which module does read_config need?",
         "choices": ["json", "socket", "math"]},
        {"id": "multi", "type": "multi", "prompt": doc + "# Modules this file uses",
         "choices": ["os", "sys", "json", "socket"]},
    ]}
    t0 = time.time()
    resp = client.post("/v1/classify", json=body)
    if resp.status_code != 200:
        raise SystemExit(f"/v1/classify failed ({resp.status_code}): {resp.text[:500]}")
    out = resp.json()
    print(f"\n/v1/classify: one call, {out['usage']['score_requests']} prefills "
          f"({out['usage']['prompt_tokens']} prompt tokens), {time.time() - t0:.2f} s:")
    choice, multi = out["results"]
    print(f"  single choice : answer {choice['answer']} ({choice['choices'][choice['index']]}); "
          + "  ".join(f"{i}={p:.3f}" for i, p in zip(choice["ids"], choice["probs"])))
    print(f"  multi-selection (one sibling per candidate, P(yes) each, on workers {', '.join(multi['workers'])}): "
          + "  ".join(f"{c}={p:.3g}" for c, p in zip(multi["choices"], multi["probs"])))


def main(argv: list[str] | None = None) -> int:
    from sgl_moe.harness.router_process import RouterProcess, RouterStartError

    parser = argparse.ArgumentParser(prog="python -m sgl_moe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-running", action="store_true", help="keep the router and workers serving")
    parser.add_argument("--port", type=int, default=30000, help="router port (workers take the next ports)")
    parser.add_argument("--workers", type=int, default=2, help="number of workers")
    parser.add_argument("--logs", type=Path, default=Path(".work/logs"))
    args, worker_args = parser.parse_known_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")

    workers = [WorkerProcess(log_path=args.logs / f"demo-worker-{i}.log", args=worker_args, port=args.port + 1 + i,
                             threads=cpu_share(args.workers)) for i in range(args.workers)]
    print(f"starting {args.workers} worker(s) on the shipped model at "
          f"{', '.join(w.url for w in workers)} (logs: {args.logs}/; about a minute on a CPU)")
    try:
        for w in workers:
            w.start()
        infos = []
        for w in workers:
            infos.append(w.wait_ready(progress=printed_progress("... still starting")))
            print(f"  worker {w.url} ready in {w.ready_seconds:.0f} s, {w.rss_bytes() / 2**30:.1f} GiB resident")
        router = RouterProcess(log_path=args.logs / "demo-router.log", worker_urls=[w.url for w in workers],
                               port=args.port)
        with router.start():
            router.wait_ready()
            print(f"router ready at {router.url} (policy longest_block_match; log: {router.log_path})")
            run_demo(router.url, infos[0], fetch_tokenizer(workers[0].url))
            with httpx.Client(timeout=10) as client:
                for w in client.get(f"{router.url}/workers").json()["workers"]:
                    print(f"  {w['id']} {w['url']}: {w['counters']['requests']} requests, "
                          f"{w['committed_blocks']} committed blocks, Θ = {w['theta_flops']:.3g} FLOPs")
            if args.keep_running:
                print(f"\nrouter keeps serving at {router.url}; Ctrl-C stops it and the workers")
                try:
                    while router.proc and router.proc.poll() is None:
                        time.sleep(1)
                except KeyboardInterrupt:
                    pass
    except (WorkerStartError, RouterStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all(workers)
    return 0
