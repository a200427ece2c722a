"""Per-layer time models of the two tasks the dual micro-batch pipeline overlaps, fitted from measurements.

    attention(batch) = α_a + β_a·Σ n_i·c_i + γ_a·Σ n_i     (n_i new tokens, c_i context of sequence i)
    moe(batch)       = α_m + β_m·Σ n_i                      (on the placement's expert device)

For the ``cpu-experts`` placement the MoE model is the *host* one (CPU experts, hidden states copied
device↔host included); for ``streams`` and ``sequential`` it is the device one. Linear in tokens (seed 002
§3); a CPU MoE at decode is really bound by the distinct experts read, which grows sublinearly in tokens,
so fit it over the batch sizes you will run. The fixed costs α are what a split pays twice.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

Kind = Literal["attention", "moe"]


@dataclass(frozen=True)
class Sample:
    """One measured task: ``seconds`` for a batch of ``tokens`` new tokens and Σ n_i·c_i = ``nc``."""

    kind: Kind
    tokens: int
    nc: int
    seconds: float


@dataclass(frozen=True)
class CostModel:
    attn_alpha: float = 0.0
    """Seconds per attention task, fixed (launches, the dense projections' weight reads)."""
    attn_beta: float = 0.0
    """Seconds per unit of Σ n_i·c_i (KV reads at decode, the score matrix at prefill)."""
    attn_gamma: float = 0.0
    """Seconds per new token (QKV/O projections, norms, router)."""
    moe_alpha: float = 0.0
    """Seconds per MoE task, fixed."""
    moe_beta: float = 0.0
    """Seconds per token routed through the experts."""

    def attention_s(self, tokens: int, nc: int) -> float:
        return self.attn_alpha + self.attn_beta * nc + self.attn_gamma * tokens

    def moe_s(self, tokens: int) -> float:
        return self.moe_alpha + self.moe_beta * tokens

    def seq_cost(self, n: int, c: int) -> float:
        """A sequence's share of one layer, fixed costs left out: what a split balances."""
        return self.attn_beta * n * c + (self.attn_gamma + self.moe_beta) * n

    @classmethod
    def fit(cls, samples: Sequence[Sample]) -> CostModel:
        """Least squares per task kind; negative coefficients (noise) are dropped and the rest refitted.

        With one context length for all samples Σ n·c is proportional to Σ n and the attention fit is the
        minimum-norm one: right for that context, not for others (measure two contexts to separate them)."""
        attn = [s for s in samples if s.kind == "attention"]
        moe = [s for s in samples if s.kind == "moe"]
        if not attn or not moe:
            raise ValueError("need at least one attention and one moe sample")
        a = _nonneg_lstsq([[1.0, float(s.nc), float(s.tokens)] for s in attn], [s.seconds for s in attn])
        m = _nonneg_lstsq([[1.0, float(s.tokens)] for s in moe], [s.seconds for s in moe])
        return cls(attn_alpha=a[0], attn_beta=a[1], attn_gamma=a[2], moe_alpha=m[0], moe_beta=m[1])


def _nonneg_lstsq(rows: list[list[float]], y: list[float]) -> list[float]:
    cols = list(range(len(rows[0])))
    while True:
        a = torch.tensor([[r[j] for j in cols] for r in rows], dtype=torch.float64)
        b = torch.tensor(y, dtype=torch.float64).unsqueeze(1)
        scale = a.abs().amax(0).clamp_min(1e-300)  # column scaling: Σ n·c is ~1e6 times Σ n
        sol = (torch.linalg.lstsq(a / scale, b, driver="gelsd").solution.squeeze(1) / scale).tolist()
        neg = [j for j, v in zip(cols, sol) if v < 0]
        if not neg:
            out = [0.0] * len(rows[0])
            for j, v in zip(cols, sol):
                out[j] = v
            return out
        cols = [j for j in cols if j not in neg]
        if not cols:
            return [0.0] * len(rows[0])


def time_call(fn: Callable[[], None], device: torch.device, reps: int = 5, warmup: int = 2) -> float:
    """Median seconds of ``fn`` alone: CUDA events on the current stream (fn's other streams are joined by
    fn itself), perf_counter on a CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(runner, sizes: Sequence[int], reps: int = 5) -> list[Sample]:
    """Attention and MoE of one layer, each alone, for the first ``b`` sequences of ``runner``'s layers,
    b in ``sizes``, on the runner's placement (``DualBatchRunner.time_tasks``)."""
    out = []
    for b in sizes:
        rows = slice(0, b)
        t_attn, t_moe = runner.time_tasks(rows, reps=reps)
        tokens, nc = runner.ops.work(rows)
        out += [Sample("attention", tokens, nc, t_attn), Sample("moe", tokens, nc, t_moe)]
    return out
