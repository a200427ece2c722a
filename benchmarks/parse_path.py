"""The router's per-request parse path alone, without HTTP: where a request's CPU goes before it is placed.

    .venv/bin/python benchmarks/parse_path.py [--prompt-tokens 200 2000] [--shapes shared unique]
        [--requests 1500] [--warmup 300] [--repeats 3] [--baseline DIR] [--out FILE.json]

Smallest run (seconds; what CI runs): ``--prompt-tokens 50 --requests 40 --warmup 10 --repeats 1``.

For each stream of ``router_capacity`` (the same texts, built once here and shared), a fresh interpreter loads the
shipped model's tokenizer as the router does (``RouterTokenizer.from_dir``, serial batches where the code under
test sets them, the router's GC settings), sends ``--warmup`` ``/generate`` bodies through the path, then measures
``--requests`` more, one at a time, stage by stage:

* **parse**: ``parse_request`` (JSON, checks, tokenizing through the prefix memo and the piece cache);
* **hash**: ``prompt_keys`` (page hashes, page size 16 as the stand-ins report);
* **attempt**: ``Attempt.of`` (the worker-bound JSON, the suspects' fingerprint).

Figures are CPU microseconds per request of the whole process (``time.process_time_ns``: a tokenizer thread pool
counts too). ``--baseline DIR`` measures the checkout DIR's code (e.g. ``git worktree add DIR <commit>``) on the
same texts, in its own interpreters, the two alternating (which goes first flips every repeat). The minimum over
repeats is reported with every repeat's figure: on a shared VM a run is only ever slowed down, not sped up. This
is the path ``router_capacity`` measures inside the live router; its HTTP, event-loop, placement and forwarding
costs are not here.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("parse", "hash", "attempt")
PAGE_SIZE = 16


def measure(texts_file: Path, warmup: int) -> dict:
    """In this interpreter (whichever checkout it imports): CPU us per request per stage, per stream."""
    import orjson

    from sgl_moe import DEFAULT_MODEL_DIR
    from sgl_moe.policy_bench.stream import StreamUnit
    from sgl_moe.router.front.attempt import Attempt
    from sgl_moe.router.request import router_tokenizer
    from sgl_moe.router.request.prompt_keys import prompt_keys
    from sgl_moe.router.request.request_limits import RequestLimits
    from sgl_moe.router.request.request_parsing import parse_request
    from sgl_moe.router.request.router_tokenizer import RouterTokenizer

    if hasattr(router_tokenizer, "encode_batches_serially"):  # what the router's main does, where it does it
        router_tokenizer.encode_batches_serially()
    streams = json.loads(texts_file.read_text())
    out = {}
    clock = time.process_time_ns
    for name, texts in streams.items():
        tok = RouterTokenizer.from_dir(DEFAULT_MODEL_DIR)
        limits = RequestLimits()
        bodies = [orjson.dumps(StreamUnit("", name, t, 0).body()) for t in texts]  # router_capacity's bodies
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)  # the router's (``service.tune_gc``)
        spent = dict.fromkeys(STAGES, 0)
        for i, raw in enumerate(bodies):
            t0 = clock()
            parsed = parse_request("/generate", raw, tokenizer=tok, served_model_name="m", context_length=1 << 20,
                                   limits=limits)
            t1 = clock()
            prompt_keys(parsed, PAGE_SIZE)
            t2 = clock()
            Attempt.of("/generate", parsed.body, {}, pass_authorization=True)
            t3 = clock()
            if i >= warmup:
                spent["parse"] += t1 - t0
                spent["hash"] += t2 - t1
                spent["attempt"] += t3 - t2
        n = len(bodies) - warmup
        out[name] = {stage: ns / n / 1e3 for stage, ns in spent.items()}
        out[name]["total"] = sum(out[name][s] for s in STAGES)
        gc.unfreeze()
    return out


def run_one(source: Path, texts_file: Path, warmup: int) -> dict:
    """``measure`` in a fresh interpreter importing ``source``'s sgl_moe."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    proc = subprocess.run([sys.executable, __file__, "--measure", str(texts_file), "--warmup", str(warmup)],
                          capture_output=True, text=True, env=env, cwd=source)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {source} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def build_texts(args) -> dict[str, list[str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from router_capacity import Filler, build_stream

    filler = Filler()
    return {f"{shape}-{tokens}": [u.text for u in (s.warmup + s.measured)]
            for tokens in args.prompt_tokens for shape in args.shapes
            for s in [build_stream(filler, shape, tokens, args.warmup, args.requests, args.seed)]}


def table(result: dict) -> str:
    labels = list(result["runs"])
    head = "| stream | stage | " + " | ".join(f"{label} us/req (repeats)" for label in labels) + " |"
    if len(labels) == 2:
        head += f" {labels[0]} / {labels[1]} |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for stream in result["streams"]:
        for stage in (*STAGES, "total"):
            cells, best = [], []
            for label in labels:
                values = [rep[stream][stage] for rep in result["runs"][label]]
                best.append(min(values))
                cells.append(f"{min(values):.0f} ({', '.join(f'{v:.0f}' for v in values)})")
            row = f"| {stream} | {stage} | " + " | ".join(cells) + " |"
            if len(labels) == 2:
                row += f" {best[0] / best[1]:.2f} |" if best[1] else " — |"
            lines.append(row)
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", nargs="+", type=int, default=[200, 2000])
    parser.add_argument("--shapes", nargs="+", default=["shared", "unique"], choices=["shared", "unique"])
    parser.add_argument("--requests", type=int, default=1500, help="measured requests per stream")
    parser.add_argument("--warmup", type=int, default=300, help="requests through the path first, not measured")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="a checkout of sgl_moe whose parse path is measured beside this one's")
    parser.add_argument("--out", type=Path, help="write every figure as JSON")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # internal: one measuring interpreter
    args = parser.parse_args(argv)
    for name in ("requests", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if any(not 20 <= n <= 8000 for n in args.prompt_tokens):
        parser.error("--prompt-tokens must be between 20 and 8000")
    if args.baseline is not None:
        if not (args.baseline / "router" / "request" / "request_parsing.py").is_file():
            parser.error(f"--baseline {args.baseline}: not a checkout of sgl_moe with router/request/ "
                         "(the layout since 04d4601)")
        args.baseline = args.baseline.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.warmup)))
        return 0
    t0 = time.monotonic()
    texts = build_texts(args)
    print(f"{len(texts)} streams of {args.warmup} + {args.requests} prompts built in {time.monotonic() - t0:.1f} s",
          file=sys.stderr)
    sources = {"this checkout": REPO, **({f"baseline {args.baseline.name}": args.baseline} if args.baseline else {})}
    runs: dict[str, list[dict]] = {label: [] for label in sources}
    with tempfile.TemporaryDirectory(prefix="parse-path-") as tmp:
        texts_file = Path(tmp) / "texts.json"
        texts_file.write_text(json.dumps(texts))
        for rep in range(args.repeats):
            order = list(sources.items())
            if rep % 2:
                order.reverse()
            for label, source in order:
                t = time.monotonic()
                runs[label].append(run_one(source, texts_file, args.warmup))
                totals = ", ".join(f"{s} {v['total']:.0f}" for s, v in runs[label][-1].items())
                print(f"[repeat {rep + 1}/{args.repeats}] {label}: {totals} us/req ({time.monotonic() - t:.0f} s)",
                      file=sys.stderr)
    result = {"command": " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
              "machine": {"cpu_count": os.cpu_count(), "platform": sys.platform},
              "streams": list(texts), "requests": args.requests, "warmup": args.warmup, "runs": runs}
    print(table(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
