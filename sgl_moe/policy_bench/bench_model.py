"""The bench model: a Qwen3-MoE-shaped model whose prefill time, on this project's CPU workers, grows with the
tokens a step computes as a saturated GPU's does (issue 31).

The shipped model (hidden 128) is so small that a CPU worker's step is mostly fixed cost (SGLang's scheduler,
per-layer and per-expert calls), so prefix reuse saves little time and placement is judged on the wrong costs.
This model is wide and shallow (hidden 1,024, 2 MoE layers of 4 experts, top-2) with the shipped model's tokenizer
and vocabulary, so every stream, router and tokenizer check works unchanged. Of the shapes fitted on the 2-core
CPU (``benchmarks/results/bench-model/``), it is the one whose step is most proportional to its tokens: fixed share
26% / 15% / 8% of a 256 / 512 / 1,024-token step, where the shipped model's is 66% / 49% / 32%. Deeper or more
expert-rich shapes read more weight bytes per step, which on a CPU is a cost that does not grow with the tokens. An
H100 has the same floor, larger: the simulator's ``h100_30b`` model, refitted from the GPU suite's measurements
(2026-11-26), has a fixed 22.4 ms per step (one HBM read of every layer's experts), 80% / 69% / 52% of a 288 / 512 /
1,024-token step; a saturated H100 runs steps of thousands of tokens (6% of a 16,384-token step).

Its weights are never written: workers start it with SGLang's ``--load-format dummy``, which fills every
parameter from a fixed seed (1234, per parameter), so every worker and every run computes with the same weights.

    python -m sgl_moe.policy_bench.bench_model [--fit] [--out FILE.json]

writes the model's directory (``config.json`` and the shipped tokenizer's files, a few hundred KB, under
``~/.cache/sgl_moe``) and prints its path; ``--fit`` also starts one worker on it and fits a step's time as
``a + b * tokens`` over batches of concurrent prompts (``step_fit``), which says how much of a step is fixed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sgl_moe import DEFAULT_MODEL_DIR

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")
"""Copied from the shipped model: the bench model reads text exactly as the shipped model does."""


@dataclass(frozen=True)
class BenchModelShape:
    """The dimensions that differ from the shipped model's ``config.json`` (its vocabulary and tokenizer stay)."""

    hidden_size: int = 1024
    num_hidden_layers: int = 2
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 64
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 1024
    intermediate_size: int = 2048

    def config(self, base: dict) -> dict:
        """``base`` (the shipped model's config) with these dimensions."""
        out = {**base, **asdict(self), "num_local_experts": self.num_experts}
        out.pop("transformers_version", None)
        return out


WORKER_ARGS = ("--load-format", "dummy")
"""What a worker on the bench model is started with besides ``--model-path``: weights from a seed, none read."""


def cache_root() -> Path:
    return Path(os.environ.get("SGL_MOE_CACHE", Path.home() / ".cache" / "sgl_moe"))


def write_bench_model(shape: BenchModelShape = BenchModelShape(), root: Path | None = None) -> Path:
    """The bench model's directory for ``shape``, written once (its name holds a hash of the config, so a changed
    shape gets a new directory and a finished one is never rewritten)."""
    base = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    config = shape.config(base)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    tag = hashlib.sha256(text.encode()).hexdigest()[:12]
    dest = (root or cache_root()) / f"bench-model-{tag}"
    if (dest / "config.json").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bench-model-", dir=dest.parent))
    try:
        for name in TOKENIZER_FILES:
            if (DEFAULT_MODEL_DIR / name).exists():
                shutil.copyfile(DEFAULT_MODEL_DIR / name, tmp / name)
        (tmp / "config.json").write_text(text)
        try:
            tmp.rename(dest)  # whole or not at all; another process may have written it meanwhile
        except OSError:
            if not (dest / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def worker_args(path: Path) -> list[str]:
    """Launcher flags that serve the bench model at ``path``."""
    return ["--model-path", str(path), *WORKER_ARGS]


MODELS = ("shipped", "bench")
"""What a benchmark's ``--model`` names: the shipped model (its real weights) or the bench model."""


def model_args(model: str) -> list[str]:
    """Launcher flags for a benchmark's ``--model`` (the shipped model is the launcher's default: none)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: one of {', '.join(MODELS)}")
    return [] if model == "shipped" else worker_args(write_bench_model())


# -- the step-time fit ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepFit:
    """``seconds = fixed_s + per_token_s * tokens`` for a prefill step, least squares over measured batches."""

    fixed_s: float
    per_token_s: float
    points: list[tuple[int, int, float]]
    """(prompts in the batch, tokens in the batch, seconds: the fastest of the repeats)."""

    def fixed_share(self, tokens: int) -> float:
        """The part of a ``tokens``-token step that does not grow with its tokens."""
        return self.fixed_s / (self.fixed_s + self.per_token_s * tokens)


def fit(points: list[tuple[int, int, float]]) -> StepFit:
    xs = [t for _, t, _ in points]
    ys = [s for _, _, s in points]
    n = len(points)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError("a fit needs batches of at least two sizes")
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return StepFit(my - b * mx, b, points)


def _post(url: str, n_tokens: int, rng: random.Random, vocab: int) -> None:
    ids = [rng.randrange(16, vocab) for _ in range(n_tokens)]  # random ids: never a cache hit
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}).encode()
    req = urllib.request.Request(url + "/generate", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        resp.read()


def time_batch(url: str, prompts: int, tokens: int, vocab: int, seed: int) -> float:
    """Seconds for ``prompts`` prompts of ``tokens`` random tokens sent at once (SGLang prefills them in one step
    when its chunk holds them): from the first send to the last answer."""
    rngs = [random.Random(f"{seed}/{i}") for i in range(prompts)]
    barrier = threading.Barrier(prompts + 1)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            _post(url, tokens, rngs[i], vocab)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(prompts)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"a fit request failed: {errors[0]!r}")
    return time.perf_counter() - t0


def step_fit(url: str, batches: list[tuple[int, int]], vocab: int, repeats: int = 3) -> StepFit:
    """Fit over ``batches`` of (prompts, tokens per prompt), each timed ``repeats`` times after one untimed run
    (the CPU backend builds kernels for each new shape); the fastest time of each batch is kept."""
    points = []
    for k, (prompts, tokens) in enumerate(batches):
        time_batch(url, prompts, tokens, vocab, seed=-1 - k)
        best = min(time_batch(url, prompts, tokens, vocab, seed=k * 100 + r) for r in range(repeats))
        points.append((prompts, prompts * tokens, best))
        print(f"  {prompts} x {tokens} tokens: {best * 1e3:.0f} ms ({prompts * tokens / best:.0f} tokens/s)",
              file=sys.stderr, flush=True)
    return fit(points)


FIT_BATCHES = [(1, 32), (1, 64), (1, 288), (2, 288), (4, 288), (1, 1024), (8, 256), (4, 512)]
"""Batches of the sizes the policy matrix's streams make: a cached request's 32-token suffix, whole 288-token
prompts one to four at a time, and larger batches up to 2,048 tokens."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_moe.policy_bench.bench_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", action="store_true", help="start one worker on the model and fit its step time")
    parser.add_argument("--threads", type=int, default=None, help="the worker's compute threads (default: every core)")
    parser.add_argument("--out", type=Path, default=None, help="write the fit as JSON here")
    parser.add_argument("--shape", nargs="+", default=[], metavar="FIELD=INT",
                        help="change the default shape's dimensions (fields: "
                             f"{', '.join(BenchModelShape.__annotations__)})")
    parser.add_argument("--shipped", action="store_true",
                        help="fit the shipped model instead (its real weights), for comparison")
    args = parser.parse_args(argv)
    try:
        shape = replace(BenchModelShape(), **{k: int(v) for k, v in (item.split("=", 1) for item in args.shape)})
    except (TypeError, ValueError) as exc:
        parser.error(f"--shape: {exc}")
    path = DEFAULT_MODEL_DIR if args.shipped else write_bench_model(shape)
    print(path)
    if not args.fit:
        return 0
    model_args = ["--model-path", str(path)] if args.shipped else worker_args(path)
    from sgl_moe.harness.worker_process import WorkerProcess, printed_progress

    log_dir = Path(tempfile.mkdtemp(prefix="bench-model-fit-"))
    # Θ pinned: the worker's own throughput profile would take a minute and is not what is fitted here.
    worker = WorkerProcess(log_path=log_dir / "worker.log", threads=args.threads,
                           args=[*model_args, "--moe-saturation-flops", "1e15"]).start()
    try:
        worker.wait_ready(timeout=900, progress=printed_progress("waiting for the worker", sys.stderr))
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
        result = step_fit(worker.url, FIT_BATCHES, vocab)
    finally:
        worker.stop()
    print(f"step = {result.fixed_s * 1e3:.1f} ms + {result.per_token_s * 1e6:.1f} us x tokens; fixed share at "
          + ", ".join(f"{t} tokens {result.fixed_share(t):.0%}" for t in (256, 512, 1024, 2048)))
    if args.out is not None:
        args.out.write_text(json.dumps({"model": "shipped" if args.shipped else "bench",
                                        "shape": None if args.shipped else asdict(shape),
                                        "threads": args.threads, "cpu_count": os.cpu_count(),
                                        "fixed_s": result.fixed_s, "per_token_s": result.per_token_s,
                                        "points": result.points}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
