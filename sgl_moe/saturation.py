"""The saturation threshold Θ (seed 000 Eq. 1 and 3, App. B.4), in FLOPs: pure arithmetic, no torch.

Two measurements: Eq. 3 from a per-layer profile (weight streaming, ``calibrated``), and for every other
worker the batch size where measured throughput stops growing (``from_throughput``).

Eq. 3: Θ = α · (max_l T_l / T_0) · F_ref, where one profile forward of F_ref FLOPs at the worker's largest
step is timed per MoE layer: T_0 is the first MoE layer's pure compute (its experts are resident), T_l the
envelope max(compute, transfer) of layer l. The ratio is how much compute must be stacked on the reference
batch to hide the slowest transfer; with no transfer it is 1 and Θ = α · F_ref.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class CalibrationError(ValueError):
    """A profile that cannot give a threshold (no layers, zero compute time)."""


@dataclass(frozen=True)
class SaturationThreshold:
    flops: float
    """Θ: in-flight FLOPs above which the router admits nothing more to this worker."""
    source: str
    """Where the value came from, in words (for logs and ``GET /workers``)."""
    state: str
    """``manual``, ``fixed`` (no weight streaming: Eq. 3 without transfer), ``calibrating`` (fallback in use
    until the profile arrives), ``calibrated``, or ``failed`` (fallback kept; the reason is in ``source``)."""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"flops": self.flops, "source": self.source, "state": self.state, **self.details}


def manual(flops: float) -> SaturationThreshold:
    return SaturationThreshold(flops, "manual (--moe-saturation-flops)", "manual")


def without_transfer(f_ref: float, step_tokens: int, margin: float, state: str = "fixed",
                     why: str = "no weight streaming: Eq. 3 with no transfer") -> SaturationThreshold:
    """α · F_ref: Eq. 3 when every transfer is hidden (or none exists); also the fallback before calibration."""
    return SaturationThreshold(f_ref * margin, f"{why} = margin {margin} x FLOPs of one {step_tokens}-token "
                                               "prefill step", state, {"step_tokens": step_tokens, "margin": margin})


def calibrated(layers: list[dict[str, float]], f_ref: float, tokens: int, margin: float) -> SaturationThreshold:
    """Eq. 3 from per-layer timings ``[{"layer", "wall_s", "wait_s"}, ...]`` of a profile forward of
    ``tokens`` tokens costing ``f_ref`` FLOPs."""
    if not layers:
        raise CalibrationError("the profile forward recorded no MoE layer")
    t0 = layers[0]["wall_s"] - layers[0]["wait_s"]
    if not t0 > 0:
        raise CalibrationError(f"the first MoE layer's compute time is {t0} s; cannot form the ratio")
    t_max = max(layer["wall_s"] for layer in layers)
    ratio = max(1.0, t_max / t0)
    slowest = max(layers, key=lambda layer: layer["wall_s"])
    return SaturationThreshold(
        margin * ratio * f_ref,
        f"calibrated (Eq. 3): margin {margin} x (max layer {t_max * 1e3:.2f} ms / first-layer compute "
        f"{t0 * 1e3:.2f} ms = {ratio:.2f}) x FLOPs of the {tokens}-token profile forward",
        "calibrated",
        {"profile_tokens": tokens, "f_ref": f_ref, "margin": margin, "ratio": ratio, "t0_s": t0,
         "t_max_s": t_max, "slowest_layer": int(slowest["layer"]),
         "mean_wait_s": sum(layer["wait_s"] for layer in layers) / len(layers)},
    )


KNEE_FRACTION = 0.85
"""Throughput profile: Θ is the least work in flight that reaches this share of the best FLOPs/s measured.

Was 0.95 until 2026-11-26. One level's FLOPs/s varies by up to ~10% between profiles of identical workers on the
2-core VM (a level measured 6% and 8% slower than the level before in 2 of 9 bench-model profiles), so a 95% knee
could not tell a flat curve from a rising one: compute-bound bench-model workers, whose FLOPs/s moved 53-79 GFLOP/s
over 1-8 requests in flight with no trend, profiled knees of 1, 2, 4 and 8 requests. At 85% all nine profiles give
1, and the shipped model's nine (FLOPs/s 1.64-2.32x from 1 to 8 in flight) keep their knee at 8. A smaller Θ on a
flat curve costs no throughput and keeps work in the router's queue, where placement sees more: Θ pinned at one request
gave lbm 1.29x / 0.96x / 1.04x `cache_aware` where the pooled 4 gave 1.22x / 0.92x / 0.96x (bulk / closed Zipf /
closed uniform, benchmarks/results/router/matrix-3scen-bench-model-pooled-theta1req-c73f1a4.md)."""
UNSATURATED_FACTOR = 2
"""Throughput profile: when throughput still grows at the largest level profiled (the KV pool holds no more
of the profile's prompts), Θ is this many times that level's work rather than that level's."""
UNSATURATED_GAIN = 0.25
"""Throughput profile: the largest level counts as still growing only when it gains at least this share over the
level before it. A profile cut short by the KV pool while still scaling gains 50-100% per doubling; on the 2-core
CPU the last level of identical idle workers gained anywhere from -4% to 27% with throughput flat within noise,
and a 5% threshold flipped Θ between 16 and 2 x 32 requests (1.1e10 vs 5.2e10 FLOPs, issue 29)."""
MONOTONE_SLACK = 0.7
"""Throughput profile: a level slower than this share of a level with fewer in flight means the timings
measured something else (other processes on the host); the profile is refused (the fallback stays)."""


def from_throughput(points: list[tuple[int, float]], prompt_flops: float, prompt_tokens: int, margin: float,
                    seconds: float, knee: float = KNEE_FRACTION, overhead_flops: float = 0.0) -> SaturationThreshold:
    """Θ where throughput stops growing: ``points`` are ``(requests in flight, seconds per round of them)``
    for ``prompt_tokens``-token prompts costing ``prompt_flops`` each, plus ``overhead_flops`` per request
    (``request_overhead``: the router counts a request as its FLOPs plus that, and so do Θ and the rates).

    The saturation point is the fewest requests in flight reaching ``knee`` of the best FLOPs/s of the
    whole profile (not the first doubling that gains little: a noisy or slowly growing curve would stop
    too early); Θ = margin x the FLOPs in flight there. A worker below Θ has idle capacity: more work in
    flight costs (almost) no time; above it, work only queues."""
    if not points:
        raise CalibrationError("the throughput profile measured no batch")
    if any(t <= 0 for _, t in points):
        raise CalibrationError("a profiled batch took no time; cannot form a throughput")
    points = sorted(points)
    sizes = [b for b, _ in points]
    per_request = prompt_flops + overhead_flops
    rates = [b * per_request / t for b, t in points]
    best = max(rates)
    for i in range(1, len(rates)):  # more work in flight never makes a server much slower: noise, not a knee
        if rates[i] < MONOTONE_SLACK * max(rates[:i]):
            raise CalibrationError(
                f"the profile is not monotone ({sizes[i]} in flight ran at {rates[i]:.3g} FLOPs/s, below "
                f"{MONOTONE_SLACK:.0%} of {max(rates[:i]):.3g} with fewer): the host's other load, not the worker")
    sat = next(i for i, r in enumerate(rates) if r >= knee * best)
    batch = sizes[sat]
    counted = f"their FLOPs + {overhead_flops:.3g} per request" if overhead_flops else "their FLOPs"
    reached = f"reach {knee:.0%} of the best FLOPs/s ({rates[sat]:.3g} of {best:.3g})"
    work = batch
    if len(rates) > 1 and rates[-1] >= (1 + UNSATURATED_GAIN) * rates[-2]:
        # The last level still gained more than the knee allows: the profile stopped (KV pool, level cap)
        # before throughput did. Θ at that level would hold the worker below its knee; past it, SGLang
        # queues what the pool cannot hold and keeps its batches full while the router answers.
        work = UNSATURATED_FACTOR * batch
        reached = (f"still gain {rates[-1] / rates[-2] - 1:.0%} over {sizes[-2]} (no knee before the profile's "
                   f"largest level); Θ counts {UNSATURATED_FACTOR} x {batch} requests")
    return SaturationThreshold(
        margin * work * per_request,
        f"measured throughput profile: {batch} request(s) of {prompt_tokens} tokens in flight {reached}; "
        f"margin {margin} x {counted}",
        "calibrated",
        {"margin": margin, "profile_prompt_tokens": prompt_tokens, "batch_sizes": sizes,
         "throughput_flops_per_s": rates, "saturation_batch": batch, "profile_seconds": seconds,
         "request_overhead_flops": overhead_flops},
    )


OVERHEAD_MAX_PROMPTS = 64.0
"""``request_overhead`` gives no figure above this many times the longer request's FLOPs: there the two timings
are so close that noise decides a / b (a profile that ran into traffic once gave 4.5e11 FLOPs per request, 1,500 x
its prompt's FLOPs, and a Θ 437 x the fallback; measured without traffic on the shipped model: 0.4-0.6 x)."""


def request_overhead(long: tuple[float, float], short: tuple[float, float]) -> float | None:
    """A request's fixed cost in FLOPs-equivalent, from two request sizes timed at the same concurrency.

    ``long`` and ``short`` are ``(FLOPs of one request, seconds per request)``. A request's time is taken as
    a + b x FLOPs (a: what every request costs whatever its length: HTTP, tokenizer manager, scheduling, a
    forward's fixed work; b: seconds per FLOP); the overhead is a / b, the FLOPs the worker could have
    computed in that time. On a GPU serving a large model a is small next to b x FLOPs; on a CPU serving a
    tiny one it is most of a short request, so a prefix-cache hit costs far more than its FLOPs say.
    None when the timings cannot give it (the longer request was not slower, or so little slower that the figure
    exceeds ``OVERHEAD_MAX_PROMPTS`` longer requests: noise)."""
    (f_long, t_long), (f_short, t_short) = long, short
    if f_long <= f_short or t_long <= t_short:
        return None
    per_flop = (t_long - t_short) / (f_long - f_short)
    overhead = max(0.0, t_short - per_flop * f_short) / per_flop
    return overhead if overhead <= OVERHEAD_MAX_PROMPTS * f_long else None
