"""Integer token-length distributions, sampled with one uniform draw and one bisect.

A shape's length is ``clamp(round((x - shift) / scale) - minus, floor, cap)`` with ``x`` uniform or
log-uniform on ``[lo, hi]`` (Table 2 units). The map from the uniform draw ``u`` to the length is
monotone, so the points where it steps are computed once (the inverse CDF at each half-integer) and a
sample is ``values[bisect(steps, u)]``: the same distribution as computing the formula per draw (up to
ties at exact halves), several times cheaper, which keeps a million requests within seconds.
"""

from __future__ import annotations

import math
from bisect import bisect
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Lengths:
    """A sampled length: ``sample(rng.random)`` returns an int between ``min`` and ``max``."""

    steps: tuple[float, ...]
    """Increasing draws at which the length steps up to the next value."""
    values: tuple[int, ...]
    """``values[i]`` for draws in ``[steps[i-1], steps[i])``; one more entry than ``steps``."""

    @classmethod
    def of(cls, lo: float, hi: float, *, log: bool, scale: float = 1.0, shift: float = 0.0, minus: int = 0,
           floor: int = 1, cap: int | None = None) -> Lengths:
        """``clamp(round((x - shift) / scale) - minus, floor, cap)``, ``x`` (log-)uniform on ``[lo, hi]``."""
        if not 0 < lo <= hi or scale <= 0:
            raise ValueError(f"bad length range [{lo}, {hi}] / {scale}")
        cap = cap if cap is not None else math.inf

        def clamp(v: int) -> int:
            return int(max(floor, min(cap, v)))

        def cdf(x: float) -> float:
            if hi == lo:
                return 0.0
            return math.log(x / lo) / math.log(hi / lo) if log else (x - lo) / (hi - lo)

        first = round((lo - shift) / scale) - minus
        last = round((hi - shift) / scale) - minus
        steps: list[float] = []
        values = [clamp(first)]
        for v in range(first, last):
            stepped = clamp(v + 1)
            if stepped != values[-1]:
                # the raw length reaches v + 1 where (x - shift) / scale - minus = v + 0.5
                steps.append(cdf((v + 0.5 + minus) * scale + shift))
                values.append(stepped)
        return cls(tuple(steps), tuple(values))

    def sample(self, random: Callable[[], float]) -> int:
        return self.values[bisect(self.steps, random())]

    @property
    def min(self) -> int:
        return self.values[0]

    @property
    def max(self) -> int:
        return self.values[-1]
