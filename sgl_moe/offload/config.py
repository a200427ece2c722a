"""Configuration of the CPU expert offload engine for decode (seed 003 §5.1, Algorithm 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Execution = Literal["on_demand", "exact", "speculative"]
EXECUTIONS: tuple[str, ...] = ("on_demand", "exact", "speculative")
"""``on_demand``: after routing, copy the layer's true experts from the host (no prefetch; ``prefetch`` is a
no-op). ``exact``: during layer l, prefetch the experts predicted for layer l+1; at l+1 run the true experts,
fetching the mispredicted ones in one batched copy (outputs equal resident weights). ``speculative``: the
caller runs the predicted experts with the predicted gating weights (it passes the predicted ids to
``acquire``), so every layer after the first is all hits; outputs differ from resident weights by design."""


class OffloadConfigError(ValueError):
    """The offload configuration cannot work (unknown execution, capacity out of range...)."""


@dataclass(frozen=True)
class OffloadConfig:
    execution: Execution = "exact"
    """How predictions are used (see ``EXECUTIONS``)."""
    capacity: int | None = None
    """Expert slots per device buffer (there are two: layer l uses buffer l % 2). ``None``: the number of
    experts E, so any batch fits. Smaller saves device memory; an ``acquire`` needing more unique experts
    than this fails."""
    timing: bool = False
    """Record per-layer entry, weights-ready and exit times (CUDA events on a GPU, wall clock on a CPU)."""
    pin_memory: bool = True
    """Pin the host expert store when a CUDA device is used (asynchronous DMA needs it)."""

    def slots(self, num_experts: int) -> int:
        return num_experts if self.capacity is None else self.capacity

    def validate(self, num_experts: int) -> None:
        if self.execution not in EXECUTIONS:
            raise OffloadConfigError(f"unknown offload execution {self.execution!r}; "
                                     f"choose one of {', '.join(EXECUTIONS)}")
        if num_experts < 1:
            raise OffloadConfigError(f"a MoE layer needs at least one expert, got {num_experts}")
        if self.capacity is not None and not 1 <= self.capacity <= num_experts:
            raise OffloadConfigError(f"offload capacity must be between 1 and the {num_experts} experts of a layer, "
                                     f"got {self.capacity}")
