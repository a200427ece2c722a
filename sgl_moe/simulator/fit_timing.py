"""``python -m sgl_moe.simulator.fit_timing --worker-url URL``: time a running worker, fit the simulator's model.

A few ``/generate`` calls (one output token) with random token ids: prompts of several lengths sent
cold, then again (cached but the last page), then with half of them cached; one burst of short
prompts sent together, which SGLang batches into one step (it separates the per-step from the
per-request cost); and bursts of 1, 2, 4, 8 prompts of the policy matrix's shape (``--shape PREFIX
SUFFIX``, default 256 + 32 tokens) sent together, first cold, then each with its own prefix cached: the
steps the matrix's workers run. Each call's wall time is fitted, by least squares with non-negative terms
over relative errors (a 60 ms step weighs as much as a 2 s one), to

    step_s x steps + request_s x requests + token_s x computed + pair_s x attention pairs
    + context_token_s x (cached + computed)

Cached tokens come from the worker's own ``meta_info.cached_tokens``. The JSON written holds the
fitted ``Calibration`` (load it with ``--calibration FILE``), every measurement and the fit's error.
Run it on an otherwise idle worker; it flushes the worker's cache first.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from sgl_moe.flops import FlopsModel
from sgl_moe.simulator.timing_model import Overlap, cpu_tiny

LENGTHS = (64, 256, 1024, 2048)
BURST = 8
"""Short prompts sent together to separate the per-step from the per-request cost."""
SHAPE = (256, 32)
"""Prefix and suffix tokens of the shaped bursts: ``policy_bench``'s matrix (``scenarios.Sizes``)."""
SHAPED_BURSTS = (1, 2, 4, 8)
"""Prompts per shaped burst: the batches the matrix's workers run (1-12 requests per step)."""
TERMS = ("step_s", "request_s", "token_s", "pair_s", "context_token_s")


@dataclass(frozen=True)
class Measurement:
    steps: int
    requests: int
    computed: int
    """Prompt tokens computed (summed over the requests of a burst)."""
    pairs: float
    context: int
    seconds: float
    label: str

    def terms(self) -> list[float]:
        return [self.steps, self.requests, self.computed, self.pairs, self.context]


def _one(client: httpx.Client, url: str, ids: list[int], clock: Callable[[], float]) -> tuple[float, int]:
    t0 = clock()
    resp = client.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1,
                                                                                      "temperature": 0}})
    resp.raise_for_status()
    return clock() - t0, int(resp.json().get("meta_info", {}).get("cached_tokens", 0))


def _point(n: int, cached: int, seconds: float, label: str, requests: int = 1) -> Measurement:
    s = n - cached
    return Measurement(1, requests, s * requests, requests * (s * cached + s * (s + 1) / 2), n * requests, seconds,
                       label)


def _burst(client: httpx.Client, url: str, prompts: list[list[int]],
           clock: Callable[[], float]) -> tuple[float, int]:
    """Send ``prompts`` together; wall time of the whole burst and the fewest cached tokens any reported."""
    t0 = clock()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda ids: _one(client, url, ids, clock), prompts))
    return clock() - t0, min(cached for _, cached in answers)


def measure(client: httpx.Client, url: str, *, lengths: Sequence[int] = LENGTHS, repeats: int = 3, burst: int = BURST,
            shape: tuple[int, int] = SHAPE, shaped_bursts: Sequence[int] = SHAPED_BURSTS, vocab: int = 4096,
            seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> list[Measurement]:
    """Timed ``/generate`` calls against the worker at ``url`` (see the module docstring)."""
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(16, vocab) for _ in range(n)]

    client.post(f"{url}/flush_cache")
    _one(client, url, fresh(32), clock)  # warm-up (first-call overheads)
    out = []
    for _ in range(repeats):
        for n in lengths:
            ids = fresh(n)
            seconds, cached = _one(client, url, ids, clock)
            out.append(_point(n, cached, seconds, f"cold {n}"))
            seconds, cached = _one(client, url, ids, clock)
            out.append(_point(n, cached, seconds, f"repeat {n}"))
            half = ids[: n // 2] + fresh(n - n // 2)
            seconds, cached = _one(client, url, half, clock)
            out.append(_point(n, cached, seconds, f"half-cached {n}"))
        if burst:
            seconds, _ = _burst(client, url, [fresh(32) for _ in range(burst)], clock)
            out.append(_point(32, 0, seconds, f"burst {burst}x32", requests=burst))
        prefix, suffix = shape
        for k in shaped_bursts:
            prompts = [fresh(prefix + suffix) for _ in range(k)]
            seconds, cached = _burst(client, url, prompts, clock)
            out.append(_point(prefix + suffix, cached, seconds, f"cold burst {k}x{prefix + suffix}", requests=k))
            seconds, cached = _burst(client, url, [ids[:prefix] + fresh(suffix) for ids in prompts], clock)
            out.append(_point(prefix + suffix, cached, seconds, f"cached burst {k}x{prefix}+{suffix}", requests=k))
    return out


def fit(points: Sequence[Measurement]) -> tuple[dict[str, float], float]:
    """Non-negative least squares over ``TERMS`` of the relative errors (each point's row divided by its time; drop
    the most negative term, refit); returns the coefficients and the largest relative error on the points."""
    a = np.array([p.terms() for p in points], dtype=float)
    y = np.array([p.seconds for p in points], dtype=float)
    active = list(range(len(TERMS)))
    while True:
        coef, *_ = np.linalg.lstsq(a[:, active] / y[:, None], np.ones_like(y), rcond=None)
        if (coef >= 0).all():
            break
        del active[int(np.argmin(coef))]
    values = dict.fromkeys(TERMS, 0.0)
    for i, c in zip(active, coef):
        values[TERMS[i]] = float(c)
    predicted = a @ np.array([values[t] for t in TERMS])
    return values, float(np.max(np.abs(predicted - y) / y))


def overlap_of(server: dict[str, Any]) -> Overlap:
    """How the worker's scheduler processes a step's results (``Calibration.overlap``), from its server args:
    SGLang's overlap loop unless ``--disable-overlap-schedule``; on a CPU the forward runs inside the launch."""
    if not server or server.get("disable_overlap_schedule", True):
        return "off"
    return "sync" if server.get("device") == "cpu" else "async"


def calibrate(url: str, client: httpx.Client | None = None, **kwargs: Any) -> dict[str, Any]:
    """Measure, fit and describe; the ``calibration`` entry is what ``--calibration FILE`` loads."""
    own = client is None
    client = client or httpx.Client(timeout=600)
    try:
        info = client.get(f"{url}/sgl_moe/info").json()
        server: dict[str, Any] = {}
        try:
            server = client.get(f"{url}/get_server_info").json()
        except (httpx.HTTPError, ValueError):
            pass
        points = measure(client, url, **kwargs)
    finally:
        if own:
            client.close()
    values, worst = fit(points)
    saturation = info.get("saturation", {})
    cal = replace(cpu_tiny(), name="calibrated", flops=FlopsModel.from_dict(info["flops"]), overlap=overlap_of(server),
                  page_size=int(info.get("page_size", 16)), **values,
                  step_tokens=int(saturation.get("step_tokens") or server.get("chunked_prefill_size") or 8192),
                  cache_tokens=int(server.get("max_total_num_tokens") or cpu_tiny().cache_tokens),
                  theta_flops=float(saturation["flops"]) if "flops" in saturation else None)
    return {"calibration": cal.to_json(), "worker": url, "model": info.get("model_name"),
            "fit": {"max_relative_error": worst, "terms": values},
            "measurements": [asdict(p) for p in points]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.simulator.fit_timing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker-url", required=True, help="a worker started with python -m sgl_moe.launch_server")
    p.add_argument("--out", type=Path, default=Path("calibration.json"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    p.add_argument("--shape", type=int, nargs=2, default=list(SHAPE), metavar=("PREFIX", "SUFFIX"),
                   help="tokens of the shaped bursts' prompts (default: the policy matrix's 256 + 32)")
    args = p.parse_args(argv)
    if min(args.shape) < 1 or min(args.lengths) < 1 or args.repeats < 1:
        p.error("--shape, --lengths and --repeats must be positive")
    try:
        result = calibrate(args.worker_url.rstrip("/"), repeats=args.repeats, lengths=args.lengths,
                           shape=tuple(args.shape))
    except httpx.HTTPError as exc:
        print(f"error: cannot measure {args.worker_url}: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(result, indent=2))
    terms = ", ".join(f"{k} {v:.3g}" for k, v in result["fit"]["terms"].items())
    print(f"{terms}; worst fit error {result['fit']['max_relative_error']:.1%}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

