"""The main job on the embedded default: one worker on the shipped model, then a prefill-only demo.

    python -m sgl_moe [--keep-running] [--port N] [worker flags ...]

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

from sgl_moe.worker_process import WorkerProcess, WorkerStartError

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


def run_demo(url: str, info: dict) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(info["tokenizer"]["path"]) / "tokenizer.json"))
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

        print("\nprefix cache: a new prompt with the same file header, sent twice through /generate:")
        body = {"text": SHARED_PREFIX + "def size(path):\n    return os.stat(path).st_size\n",
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        for attempt in ("first time ", "second time"):
            meta = client.post("/generate", json=body).json()["meta_info"]
            print(f"  {attempt}: {meta['prompt_tokens']} prompt tokens, {meta['cached_tokens']} served from the "
                  f"prefix cache (page size {info['page_size']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_moe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-running", action="store_true", help="keep the worker serving after the demo")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--log", type=Path, default=Path(".work/logs/demo-worker.log"))
    args, worker_args = parser.parse_known_args(argv)

    worker = WorkerProcess(log_path=args.log, args=worker_args, port=args.port)
    print(f"starting a worker on the shipped model at {worker.url} (log: {args.log}; about a minute on a CPU)")
    with worker.start():
        try:
            info = worker.wait_ready(progress=lambda s: print(f"  ... still starting ({s:.0f} s)", flush=True))
        except WorkerStartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"worker ready in {worker.ready_seconds:.0f} s, {worker.rss_bytes() / 2**30:.1f} GiB resident")
        run_demo(worker.url, info)
        if args.keep_running:
            print(f"\nworker keeps serving at {worker.url}; Ctrl-C stops it")
            try:
                while worker.proc and worker.proc.poll() is None:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
    return 0
