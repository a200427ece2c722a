"""Per-layer timing hooks: entry, weights ready, exit (CUDA events on a GPU, wall clock on a CPU).

Off unless asked for (``StreamConfig.timing``), so steady-state serving pays nothing. ``collect()`` is the
only place that synchronizes, and it runs after the profiled forward, outside the hot path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerTiming:
    layer: int
    wall_s: float
    """Entry of this layer to entry of the next (the last: to its exit): the envelope max(compute, transfer)."""
    wait_s: float
    """Time the compute waited for this layer's experts to arrive."""

    @property
    def compute_s(self) -> float:
        return max(0.0, self.wall_s - self.wait_s)


class LayerTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[int, str, object]] = []

    def _now(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def enter(self, layer: int) -> None:
        self._marks.append((layer, "enter", self._now()))

    def ready(self, layer: int) -> None:
        self._marks.append((layer, "ready", self._now()))

    def exit(self, layer: int) -> None:
        self._marks.append((layer, "exit", self._now()))

    def reset(self) -> None:
        self._marks.clear()

    def _seconds(self, a: object, b: object) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1000.0  # type: ignore[union-attr]
        return float(b) - float(a)  # type: ignore[arg-type]

    def collect(self) -> list[LayerTiming]:
        """Timings of the layers entered since the last reset, in entry order; then reset."""
        if self.cuda:
            torch.cuda.synchronize()
        entries = [(layer, t) for layer, kind, t in self._marks if kind == "enter"]
        ready = {}
        exits = {}
        for layer, kind, t in self._marks:
            if kind == "ready":
                ready[layer] = t
            elif kind == "exit":
                exits[layer] = t
        out = []
        for i, (layer, t) in enumerate(entries):
            end = entries[i + 1][1] if i + 1 < len(entries) else exits.get(layer)
            if end is None:
                continue
            wait = self._seconds(t, ready[layer]) if layer in ready else 0.0
            out.append(LayerTiming(layer, self._seconds(t, end), wait))
        self.reset()
        return out
