"""The expert weight store: per MoE layer, the fused expert weights (the backing copy of the streamer).

Layout per layer, as SGLang's FusedMoE keeps them: ``w13`` [E, 2I, H] (gate and up projections stacked)
and ``w2`` [E, H, I] (down projection). E = experts, I = expert width, H = hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerWeights:
    """One MoE layer's expert weights (full set, a shard, or a device slot's views)."""

    w13: torch.Tensor  # [E, 2I, H]
    w2: torch.Tensor  # [E, H, I]

    @property
    def nbytes(self) -> int:
        return self.w13.numel() * self.w13.element_size() + self.w2.numel() * self.w2.element_size()

    @property
    def num_experts(self) -> int:
        return int(self.w13.shape[0])

    def shard(self, rank: int, world: int) -> LayerWeights:
        """Rows [rank·E/N, (rank+1)·E/N): the experts this rank owns in gather modes."""
        e = self.num_experts
        if e % world:
            raise ValueError(f"{e} experts do not split evenly over {world} ranks")
        n = e // world
        return LayerWeights(self.w13[rank * n:(rank + 1) * n], self.w2[rank * n:(rank + 1) * n])


class ExpertStore:
    """The experts of every MoE layer, in layer order, on the host (pinned when useful) or sharded.

    Built from tensors wherever they are; ``to_host`` moves them off the device so that only the streamer's
    window occupies device memory.
    """

    def __init__(self, layers: list[LayerWeights]) -> None:
        if not layers:
            raise ValueError("an expert store needs at least one layer")
        shapes = {(tuple(layer.w13.shape), tuple(layer.w2.shape), layer.w13.dtype) for layer in layers}
        if len(shapes) != 1:
            raise ValueError(f"all layers must share one expert shape and dtype, got {sorted(map(str, shapes))}")
        self.layers = layers

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerWeights:
        return self.layers[layer]

    @property
    def layer_bytes(self) -> int:
        return self.layers[0].nbytes

    @property
    def total_bytes(self) -> int:
        return self.layer_bytes * len(self.layers)

    @classmethod
    def to_host(cls, layers: list[LayerWeights], pin: bool) -> ExpertStore:
        """Host copies of ``layers`` (pinned if ``pin`` and CUDA is available; the inputs may then be freed).

        CPU tensors that need no pinning are kept as they are (no copy).
        """
        pin = pin and torch.cuda.is_available()

        def host(t: torch.Tensor) -> torch.Tensor:
            if t.device.type == "cpu" and (not pin or t.is_pinned()):
                return t.contiguous()
            out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            out.copy_(t)
            return out

        return cls([LayerWeights(host(layer.w13), host(layer.w2)) for layer in layers])

    def shards(self, rank: int, world: int) -> list[LayerWeights]:
        """This rank's 1/N of every layer (views of the store; copy them where they must live)."""
        return [layer.shard(rank, world) for layer in self.layers]
