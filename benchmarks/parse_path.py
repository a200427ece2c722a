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
same texts, in its own interpreters, the two alternating (which goes first flips every repeat); a checkout whose C
extensions do not import is refused unless ``--allow-python-fallbacks`` (``sgl_moe.harness.native_modules``). The
minimum over repeats is reported with every repeat's figure: on a shared VM a run is only ever slowed down, not sped
up. This is the path ``router_capacity`` measures inside the live router; its HTTP, event-loop, placement and forwarding
costs are not here.

``--instructions`` counts instead of timing: each interpreter runs under valgrind's callgrind, instrumented only
while a stream's measured requests run (``callgrind_control``), and the figure is instructions per request (all
stages together). On this shared VM, where CPU time moves by up to 2x between repeats, a count repeats within
0.2% and shows a 5% change at once; it runs ~50x slower (``--requests 200`` takes about a minute per stream and
checkout, two at a time). Code that picks its instructions by CPU (OpenSSL's SHA-256) runs its generic path under
valgrind, so a count is a proxy for CPU time, not a measure of it. Needs ``valgrind`` (Debian: ``apt-get install
valgrind``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("parse", "hash", "attempt")
PAGE_SIZE = 16


def measure(texts_file: Path, warmup: int, count: bool = False) -> dict:
    """In this interpreter (whichever checkout it imports): CPU us per request per stage, per stream; with ``count``
    (under callgrind), each stream's measured requests are instrumented and dumped apart instead."""
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
            if count and i == warmup:
                _callgrind("-i", "on")
            t0 = clock()
            parsed = parse_request("/generate", raw, tokenizer=tok, served_model_name="m", context_length=1 << 20,
                                   limits=limits)
            t1 = clock()
            prompt_keys(parsed, PAGE_SIZE)
            t2 = clock()
            ids_json = getattr(parsed, "input_ids_json", None)  # since 2026-11-30: the memo's JSON of a shared prefix
            Attempt.of("/generate", parsed.body, {}, pass_authorization=True,
                       **({"input_ids_json": ids_json()} if ids_json is not None else {}))
            t3 = clock()
            if i >= warmup:
                spent["parse"] += t1 - t0
                spent["hash"] += t2 - t1
                spent["attempt"] += t3 - t2
        n = len(bodies) - warmup
        if count:
            _callgrind("-d", name)  # one part file per stream, in stream order (a dump asked for after "-i off"
            _callgrind("-i", "off")  # is never taken); the two calls' own instructions are counted too
        out[name] = {stage: ns / n / 1e3 for stage, ns in spent.items()}
        out[name]["total"] = sum(out[name][s] for s in STAGES)
        gc.unfreeze()
    return out


def _valgrind_available() -> bool:
    from sgl_moe.harness import callgrind  # in this checkout's interpreter only (see ``_callgrind``)

    return callgrind.available()


def _callgrind(*args: str) -> None:
    # Not ``sgl_moe.harness.callgrind.control``: this runs in the measured interpreter, whose sgl_moe may be an
    # older checkout's (``--baseline``) without that module.
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)


def run_one(source: Path, texts_file: Path, warmup: int, count_dir: Path | None = None,
            python: str | None = None) -> dict:
    """``measure`` in a fresh interpreter (``python``, default this one) importing ``source``'s sgl_moe; with
    ``count_dir``, under callgrind, and the result is instructions per request per stream (``{"instructions": n}``)."""
    from sgl_moe.harness import callgrind  # here, in this checkout's interpreter (see ``_callgrind``)

    env = {**os.environ, "PYTHONPATH": str(source)}
    cmd = [python or sys.executable, __file__, "--measure", str(texts_file), "--warmup", str(warmup)]
    if count_dir is not None:
        count_dir.mkdir(parents=True, exist_ok=True)
        env.update(PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false")
        cmd = [*callgrind.command(count_dir / "callgrind.out"), *cmd, "--count"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=source)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {source} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.splitlines()[-1])
    if count_dir is None:
        return result
    parts = callgrind.dumps(count_dir / "callgrind.out")
    if len(parts) != len(result):
        raise RuntimeError(f"callgrind wrote {len(parts)} dumps for {len(result)} streams in {count_dir}")
    requests = json.loads(texts_file.read_text())
    counted = {}
    for name, part in zip(result, parts):
        counted[name] = {"instructions": callgrind.totals(part) / (len(requests[name]) - warmup)}
    return counted


def build_texts(args) -> dict[str, list[str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from router_capacity import Filler, build_stream

    filler = Filler()
    return {f"{shape}-{tokens}": [u.text for u in (s.warmup + s.measured)]
            for tokens in args.prompt_tokens for shape in args.shapes
            for s in [build_stream(filler, shape, tokens, args.warmup, args.requests, args.seed)]}


def table(result: dict) -> str:
    labels = list(result["runs"])
    if result.get("instructions"):
        head = "| stream | " + " | ".join(f"{label} instructions/req" for label in labels) + " |"
        if len(labels) == 2:
            head += f" {labels[0]} / {labels[1]} |"
        lines = [head, "|" + "---|" * (head.count("|") - 1)]
        for stream in result["streams"]:
            counts = [result["runs"][label][0][stream]["instructions"] for label in labels]
            row = f"| {stream} | " + " | ".join(f"{c:,.0f}" for c in counts) + " |"
            if len(labels) == 2:
                row += f" {counts[0] / counts[1]:.3f} |"
            lines.append(row)
        return "\n".join(lines)
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
    parser.add_argument("--baseline-python", metavar="PYTHON",
                        help="the interpreter the baseline is measured on (default: this one); with --baseline naming "
                             "this checkout, the same code on two builds of Python")
    parser.add_argument("--allow-python-fallbacks", action="store_true",
                        help="measure a --baseline checkout whose C extensions do not import (a git worktree holds no "
                             "built .so files): it then runs their Python references. Refused by default")
    parser.add_argument("--out", type=Path, help="write every figure as JSON")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per request under valgrind's callgrind instead of timing (once, "
                             "the checkouts two at a time; see above)")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # internal: one measuring interpreter
    parser.add_argument("--count", action="store_true", help=argparse.SUPPRESS)  # internal: under callgrind
    args = parser.parse_args(argv)
    if args.instructions and not _valgrind_available():
        parser.error("--instructions needs valgrind (Debian: apt-get install valgrind)")
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
    if args.baseline_python is not None:
        if args.baseline is None:
            parser.error("--baseline-python needs --baseline DIR")
        if shutil.which(args.baseline_python) is None:
            parser.error(f"--baseline-python {args.baseline_python}: no such interpreter")
    if args.baseline is not None and not args.allow_python_fallbacks:
        from sgl_moe.harness import native_modules  # this checkout's, in this interpreter

        why = native_modules.refusal(args.baseline, args.baseline_python)
        if why is not None:
            parser.error(f"--baseline {why}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.warmup, args.count)))
        return 0
    t0 = time.monotonic()
    texts = build_texts(args)
    print(f"{len(texts)} streams of {args.warmup} + {args.requests} prompts built in {time.monotonic() - t0:.1f} s",
          file=sys.stderr)
    sources = {"this checkout": REPO, **({f"baseline {args.baseline.name}": args.baseline} if args.baseline else {})}
    pythons = {label: args.baseline_python if label.startswith("baseline") else None for label in sources}
    runs: dict[str, list[dict]] = {label: [] for label in sources}
    with tempfile.TemporaryDirectory(prefix="parse-path-") as tmp:
        texts_file = Path(tmp) / "texts.json"
        texts_file.write_text(json.dumps(texts))
        if args.instructions:  # deterministic: once each, side by side (a core each)
            from concurrent.futures import ThreadPoolExecutor

            t = time.monotonic()
            with ThreadPoolExecutor(len(sources)) as pool:
                futures = {label: pool.submit(run_one, source, texts_file, args.warmup, Path(tmp) / f"cg{k}",
                                                  pythons[label])
                           for k, (label, source) in enumerate(sources.items())}
                for label, future in futures.items():
                    runs[label].append(future.result())
            print(f"counted in {time.monotonic() - t:.0f} s", file=sys.stderr)
        for rep in range(0 if args.instructions else args.repeats):
            order = list(sources.items())
            if rep % 2:
                order.reverse()
            for label, source in order:
                t = time.monotonic()
                runs[label].append(run_one(source, texts_file, args.warmup, python=pythons[label]))
                totals = ", ".join(f"{s} {v['total']:.0f}" for s, v in runs[label][-1].items())
                print(f"[repeat {rep + 1}/{args.repeats}] {label}: {totals} us/req ({time.monotonic() - t:.0f} s)",
                      file=sys.stderr)
    result = {"command": " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
              "machine": {"cpu_count": os.cpu_count(), "platform": sys.platform},
              "streams": list(texts), "requests": args.requests, "warmup": args.warmup,
              "instructions": args.instructions, "runs": runs}
    print(table(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
