"""Choose the split and order of the two-micro-batch layer pipeline (FinDEP-style, seed 002 §3–4).

The pipeline, per layer l and micro-batch X: attention a_X^l → MoE m_X^l → a_X^{l+1}. Two resources run
their tasks in a fixed order, the *lead* micro-batch first in every layer (order "ab": A leads):
    attention resource:  a_lead^0, a_other^0, a_lead^1, a_other^1, …
    MoE resource:        m_lead^0, m_other^0, m_lead^1, …
Finish times obey a max-plus recursion (``layer_step``); the makespan is the last MoE's finish. For
``cpu-experts`` the resources are the GPU and the CPU (η = 1 unless measured otherwise: two cores of one CPU
emulating them share its memory bandwidth). For ``streams`` both are one GPU: concurrent kernels overlap with
efficiency η ∈ [0, 1], modelled as serial − η·(serial − two-resource makespan).
Embedding and LM head are shared and outside the model (the same in every plan).

The recursion is max-plus linear, so once the per-layer increment is the same for every finish time
(period 1) or every second layer (period 2) the rest is extrapolated exactly: a solve costs a few layers,
not L. Candidate split points: the cost-balanced one ± ``window``, and the attention- and MoE-balanced ones.
A plan without overlap (one micro-batch) is chosen when the split's extra fixed costs outweigh the overlap.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import mul
from typing import Literal

from sgl_moe.overlap.costs import CostModel
from sgl_moe.overlap.split import Split, balanced_point, split_at

Order = Literal["ab", "ba"]
Placement = Literal["sequential", "streams", "cpu-experts"]
ORDERS: tuple[Order, ...] = ("ab", "ba")


@dataclass(frozen=True)
class Plan:
    split: Split
    """The two micro-batches; ``split.overlap`` False (or ``overlap`` False) runs the batch sequentially."""
    order: Order
    """Which micro-batch leads on both resources in every layer."""
    predicted_makespan: float
    """Seconds for all layers with this plan (== predicted_sequential when overlap is off)."""
    predicted_sequential: float
    """Seconds for all layers run as one batch without overlap."""
    bound: float
    """physics.md: the largest fraction of the sequential time overlap can save, min(T_a, T_m)/(T_a + T_m)."""
    overlap: bool = True
    reason: str = ""
    """Why overlap is off, when it is."""

    @property
    def predicted_gain(self) -> float:
        """Fraction of the sequential time saved (≤ bound)."""
        return 1.0 - self.predicted_makespan / self.predicted_sequential if self.predicted_sequential else 0.0


def layer_step(state: tuple[float, float, float, float], a1: float, m1: float, a2: float, m2: float
               ) -> tuple[float, float, float, float]:
    """Finish times (a_lead, a_other, m_lead, m_other) of the next layer from this layer's."""
    fa1, fa2, fm1, fm2 = state
    na1 = max(fa2, fm1) + a1
    na2 = max(na1, fm2) + a2
    nm1 = max(fm2, na1) + m1
    nm2 = max(nm1, na2) + m2
    return na1, na2, nm1, nm2


def two_resource_makespan(a1: float, m1: float, a2: float, m2: float, layers: int) -> float:
    """Makespan of the ping-pong over ``layers`` layers, lead micro-batch (a1, m1), other (a2, m2)."""
    s = layer_step((0.0, 0.0, 0.0, 0.0), a1, m1, a2, m2)
    hist = [s]
    tol = 1e-12 * (a1 + m1 + a2 + m2 + 1e-30)
    for layer in range(1, layers):
        s = layer_step(s, a1, m1, a2, m2)
        hist.append(s)
        left = layers - 1 - layer
        for period in (1, 2):
            if len(hist) > period:
                d = [x - y for x, y in zip(s, hist[-1 - period])]
                if max(d) - min(d) <= tol:
                    # Max-plus homogeneity: the same increment repeats every `period` layers from here.
                    base = s[3] if left % period == 0 else hist[-2][3]
                    return base + (left + period - 1) // period * d[3]
        if len(hist) > 3:
            hist.pop(0)
    return s[3]


class Solver:
    """Plans for one cost model, layer count and placement; cached by batch shape.

    The cache key is the sequence of (new tokens, context // ``context_bucket``): a decode batch re-solves
    when its composition changes or a context crosses a bucket, not at every step."""

    def __init__(self, model: CostModel, layers: int, placement: Placement, eta: float = 1.0, window: int = 2,
                 context_bucket: int = 256, cache_size: int = 1024, force_overlap: bool = False) -> None:
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"overlap efficiency eta must be in [0, 1], got {eta}")
        self.model, self.layers, self.placement = model, layers, placement
        self.eta = eta
        self.window, self.context_bucket, self.cache_size = window, context_bucket, cache_size
        self.force_overlap = force_overlap
        """Overlap even where the model predicts no gain (A/B measurements); never for a batch of one."""
        self._cache: OrderedDict[tuple, Plan] = OrderedDict()
        self.solves = 0

    def plan(self, new_tokens: Sequence[int], contexts: Sequence[int]) -> Plan:
        key = tuple(new_tokens) + (-1,) + tuple(c // self.context_bucket for c in contexts)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        plan = self.solve(new_tokens, contexts)
        self._cache[key] = plan
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return plan

    def makespan(self, tok: tuple[int, int], nc: tuple[int, int], order: Order) -> float:
        """Predicted seconds of the pipeline for micro-batches with (tokens, Σn·c) = (tok[i], nc[i])."""
        cm, L = self.model, self.layers
        a = [cm.attention_s(tok[i], nc[i]) for i in (0, 1)]
        m = [cm.moe_s(tok[i]) for i in (0, 1)]
        lead, other = (0, 1) if order == "ab" else (1, 0)
        two = two_resource_makespan(a[lead], m[lead], a[other], m[other], L)
        serial = L * (a[0] + a[1] + m[0] + m[1])
        return serial - self.eta * (serial - two)

    def solve(self, new_tokens: Sequence[int], contexts: Sequence[int]) -> Plan:
        self.solves += 1
        cm, L, size = self.model, self.layers, len(new_tokens)
        if size == 0 or size != len(contexts):
            raise ValueError("need one context per sequence and at least one sequence")
        tok_pre = list(accumulate(new_tokens, initial=0))
        nc_pre = list(accumulate(map(mul, new_tokens, contexts), initial=0))
        # Costs are linear in the two prefix sums: no per-sequence Python arithmetic (the solve is ~O(log B)).
        cost_pre = _LinearPrefix(cm.attn_beta, nc_pre, cm.attn_gamma + cm.moe_beta, tok_pre)
        t_a, t_m = cm.attention_s(tok_pre[-1], nc_pre[-1]), cm.moe_s(tok_pre[-1])
        sequential = L * (t_a + t_m)
        bound = min(t_a, t_m) / (t_a + t_m) if t_a + t_m > 0 else 0.0
        whole = Split(tuple(range(size)), (), cost_pre[-1], 0.0)
        if self.placement == "sequential" or size == 1:
            why = "batch of 1: nothing to overlap, overlap off" if size == 1 else "sequential placement"
            return Plan(whole, "ab", sequential, sequential, bound, overlap=False, reason=why)
        attn_pre = _LinearPrefix(cm.attn_beta, nc_pre, cm.attn_gamma, tok_pre)
        points = {balanced_point(cost_pre) + d for d in range(-self.window, self.window + 1)}
        points |= {balanced_point(attn_pre), balanced_point(tok_pre)}
        best: tuple[float, int, Order] | None = None
        for k in sorted(p for p in points if 1 <= p <= size - 1):
            tok = (tok_pre[k], tok_pre[-1] - tok_pre[k])
            nc = (nc_pre[k], nc_pre[-1] - nc_pre[k])
            for order in ORDERS:
                t = self.makespan(tok, nc, order)
                if best is None or t < best[0] - 1e-15:
                    best = (t, k, order)
        assert best is not None
        t, k, order = best
        if t >= sequential and not self.force_overlap:
            return Plan(whole, "ab", sequential, sequential, bound, overlap=False,
                        reason=f"overlap does not pay: predicted {t * 1e3:.3f} ms "
                               f"≥ sequential {sequential * 1e3:.3f} ms")
        return Plan(split_at(range(size), k, cost_pre), order, t, sequential, bound)


class _LinearPrefix:
    """prefix[i] = a·x[i] + b·y[i], computed on access (bisect reads ~log B of them)."""

    def __init__(self, a: float, x: Sequence[int], b: float, y: Sequence[int]) -> None:
        self.a, self.x, self.b, self.y = a, x, b, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> float:
        return self.a * self.x[i] + self.b * self.y[i]
