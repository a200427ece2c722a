"""Configuration of the expert weight streaming engine (AsyncEP, seed 000 §6 and App. B.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StreamMode = Literal["off", "host", "gather", "hybrid", "on_demand"]
MODES: tuple[str, ...] = ("off", "host", "gather", "hybrid", "on_demand")
"""``off``: every layer's experts resident on the device (the reference). ``host``: the backing copy lives
in (pinned) host memory and a window of layers is streamed ahead on a copy stream. ``gather``: each rank
holds 1/N of every layer's experts on the device; the next layer is all-gathered in the background.
``hybrid``: shards live in host memory; they are copied to the device ahead of the all-gather that
assembles the layer (two channels at once, seed 000 §6.3). ``on_demand``: the baseline that copies a
layer synchronously when it is needed (no lookahead)."""


class StreamConfigError(ValueError):
    """The streaming configuration cannot work (bad window, mode needing ranks without them...)."""


@dataclass(frozen=True)
class StreamConfig:
    mode: StreamMode = "host"
    """Where the experts come from (see ``MODES``)."""
    window: int = 2
    """Device slots for streamed layers (a ring reused without allocation). 2 = ping-pong: layer l computes
    while l+1 arrives. The first MoE layer is resident on top of the window when ``first_layer_resident``."""
    first_layer_resident: bool = True
    """Keep the first MoE layer's experts resident on every rank (seed 000 §6.2), so each forward starts
    without waiting and its time is pure compute (the reference of Θ calibration)."""
    timing: bool = False
    """Record per-layer entry, wait and exit times (CUDA events on a GPU, wall clock on a CPU)."""
    pin_memory: bool = True
    """Pin the host backing store when a CUDA device is used (needed for asynchronous copies)."""

    def validate(self, num_layers: int, world_size: int = 1) -> None:
        if self.mode not in MODES:
            raise StreamConfigError(f"unknown streaming mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.window < 1:
            raise StreamConfigError(f"the stream window must be at least 1 layer, got {self.window}")
        if num_layers < 1:
            raise StreamConfigError("the model has no MoE layers to stream")
        if self.mode in ("gather", "hybrid") and world_size < 2:
            raise StreamConfigError(f"mode {self.mode!r} gathers expert shards from peer ranks and needs at "
                                    f"least 2 ranks in the process group; this one has {world_size}")
