"""The weight streamer: a ring of device slots holding the next layers' experts, refilled in the background.

Protocol, called by the model in layer order: ``w = acquire(l)`` at the MoE layer's entry (the compute waits
for layer l's fence: a ``wait_event`` on a GPU), run the experts with ``w``, then ``release(l)`` (records the
compute fence of the slot and starts filling it with the layer ``window`` positions ahead, cyclically, so
the next forward's first layers arrive while the current one finishes). Slots are allocated once.

Modes (``StreamConfig.mode``): off (all resident), host (copy from the host store on the copy lane),
gather (all-gather of per-rank device shards on the gather lane), hybrid (host shard → device staging on
the copy lane, then all-gather on the gather lane, two channels in parallel), on_demand (synchronous copy at
entry: the baseline).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sgl_moe.streaming.config import StreamConfig, StreamConfigError
from sgl_moe.streaming.expert_store import ExpertStore, LayerWeights
from sgl_moe.streaming.lanes import DoneFence, Fence, compute_fence, make_lane
from sgl_moe.streaming.layer_timer import LayerTimer

log = logging.getLogger("sgl_moe.streaming")


def _empty_like(layer: LayerWeights, device: torch.device) -> LayerWeights:
    return LayerWeights(torch.empty(layer.w13.shape, dtype=layer.w13.dtype, device=device),
                        torch.empty(layer.w2.shape, dtype=layer.w2.dtype, device=device))


def _copy(dst: LayerWeights, src: LayerWeights) -> None:
    dst.w13.copy_(src.w13, non_blocking=True)
    dst.w2.copy_(src.w2, non_blocking=True)


def _gather_into(dist, out: torch.Tensor, shard: torch.Tensor, group) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, shard, group=group)


@dataclass
class StreamStats:
    loads: int = 0
    """Layer transfers issued (copies, gathers)."""
    bytes_moved: int = 0
    """Bytes written into device slots (a gather counts the whole layer it assembles)."""
    restarts: int = 0
    """Out-of-order acquires that made the streamer rebuild its schedule (never in a plain forward)."""


class WeightStreamer:
    def __init__(self, store: ExpertStore, cfg: StreamConfig, device: torch.device | str, *,
                 group: torch.distributed.ProcessGroup | None = None, copy_delay_s: float = 0.0) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.num_layers = len(store)
        self.group = group
        world = 1
        self.rank = 0
        if cfg.mode in ("gather", "hybrid"):
            import torch.distributed as dist

            if not dist.is_initialized():
                raise StreamConfigError(f"mode {cfg.mode!r} needs an initialised torch.distributed process group")
            world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        cfg.validate(self.num_layers, world)
        self.world = world
        self.store = store
        self.stats = StreamStats()
        self.timer = LayerTimer(self.device) if cfg.timing else None
        self._dist = None
        self._resident: dict[int, LayerWeights] = {}

        if cfg.mode == "off" or (cfg.first_layer_resident and cfg.mode != "on_demand"):
            keep = range(self.num_layers) if cfg.mode == "off" else (0,)
            for layer in keep:
                self._resident[layer] = _empty_like(store[layer], self.device)
                _copy(self._resident[layer], store[layer])
        self.streamed = [layer for layer in range(self.num_layers) if layer not in self._resident]
        self._pos = {layer: i for i, layer in enumerate(self.streamed)}
        window = 1 if cfg.mode == "on_demand" else min(cfg.window, len(self.streamed))
        self.window = window
        self._slots = [_empty_like(store[0], self.device) for _ in range(window)] if self.streamed else []
        self._slot_layer: list[int | None] = [None] * window
        self._slot_of: dict[int, int] = {}
        self._ready: list[Fence] = [DoneFence() for _ in range(window)]
        self._free: list[Fence] = [DoneFence() for _ in range(window)]
        # Every streamed layer fits in the window: load each once and keep it.
        self._all_fit = cfg.mode != "on_demand" and window == len(self.streamed)

        self._copy_lane = make_lane("expert-copy", self.device, copy_delay_s)
        self._gather_lane = None
        self._shards: dict[int, LayerWeights] = {}
        self._staging: list[LayerWeights] = []
        self._staging_free: list[Fence] = []
        self._staged: dict[int, tuple[int, Fence]] = {}
        if cfg.mode in ("gather", "hybrid"):
            import torch.distributed as dist

            self._dist = dist
            self._gather_lane = make_lane("expert-gather", self.device)
            for layer in self.streamed:
                shard = store[layer].shard(self.rank, world)
                if cfg.mode == "gather":  # device-resident shard
                    self._shards[layer] = _empty_like(shard, self.device)
                    _copy(self._shards[layer], shard)
                else:  # hybrid: the shard stays in the (pinned) host store
                    self._shards[layer] = shard
            if cfg.mode == "hybrid":
                shard0 = self._shards[self.streamed[0]]
                self._staging = [_empty_like(shard0, self.device) for _ in range(2)]
                self._staging_free = [DoneFence(), DoneFence()]
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # resident copies and shards in place
        if cfg.mode != "on_demand":
            for slot, layer in enumerate(self.streamed[:window]):
                self._load(layer, slot)
        log.info("weight streamer: mode %s, %d MoE layers (%d resident, %d streamed through %d slots), "
                 "%.1f MB per layer, %.1f MB of experts on %s", cfg.mode, self.num_layers, len(self._resident),
                 len(self.streamed), window, store.layer_bytes / 1e6, self.device_expert_bytes() / 1e6, self.device)

    # -- protocol ------------------------------------------------------------------------------------------
    def acquire(self, layer: int) -> LayerWeights:
        """Layer ``layer``'s experts on the device, valid until ``release(layer)``."""
        if self.timer:
            self.timer.enter(layer)
        if layer in self._resident:
            weights = self._resident[layer]
        else:
            if self.cfg.mode == "on_demand":
                self._load(layer, 0)
            elif layer not in self._slot_of:
                self._restart_at(layer)
            slot = self._slot_of[layer]
            self._ready[slot].wait()
            weights = self._slots[slot]
        if self.timer:
            self.timer.ready(layer)
        return weights

    def release(self, layer: int) -> None:
        """The compute using ``layer``'s experts has been issued; its slot may be refilled after it completes."""
        if self.timer:
            self.timer.exit(layer)
        if layer in self._resident:
            return
        slot = self._slot_of[layer]
        self._free[slot] = compute_fence(self.device)
        if self._all_fit:
            return
        if self.cfg.mode == "on_demand":
            del self._slot_of[layer]
            self._slot_layer[slot] = None
            return
        nxt = self.streamed[(self._pos[layer] + self.window) % len(self.streamed)]
        self._load(nxt, slot)

    # -- transfers -----------------------------------------------------------------------------------------
    def _load(self, layer: int, slot: int) -> None:
        old = self._slot_layer[slot]
        if old is not None:
            self._slot_of.pop(old, None)
        self._slot_layer[slot] = layer
        self._slot_of[layer] = slot
        dst = self._slots[slot]
        mode = self.cfg.mode
        if mode in ("host", "on_demand"):
            src = self.store[layer]
            self._ready[slot] = self._copy_lane.submit(lambda: _copy(dst, src), [self._free[slot]])
        elif mode == "gather":
            self._ready[slot] = self._gather(dst, self._shards[layer], [self._free[slot]])
        else:  # hybrid
            stage_slot, staged = self._stage(layer)
            fence = self._gather(dst, self._staging[stage_slot], [self._free[slot], staged])
            self._staging_free[stage_slot] = fence
            self._staged.pop(layer, None)
            self._ready[slot] = fence
            # Start the host copy of the layer after this one now, so PCIe runs beside this all-gather.
            ahead = self.streamed[(self._pos[layer] + 1) % len(self.streamed)]
            if ahead != layer:
                self._stage(ahead)
        self.stats.loads += 1
        self.stats.bytes_moved += self.store.layer_bytes

    def _gather(self, dst: LayerWeights, shard: LayerWeights, after: list[Fence]) -> Fence:
        dist, group = self._dist, self.group

        def work() -> None:
            # Rank r's rows land in place at rows [r·E/N, (r+1)·E/N) of the slot: no temporary.
            _gather_into(dist, dst.w13, shard.w13, group)
            _gather_into(dist, dst.w2, shard.w2, group)

        assert self._gather_lane is not None
        return self._gather_lane.submit(work, after)

    def _stage(self, layer: int) -> tuple[int, Fence]:
        """Hybrid: the host shard of ``layer`` copied into a device staging buffer (once per use)."""
        if layer in self._staged:
            return self._staged[layer]
        stage_slot = self._pos[layer] % len(self._staging)
        dst, src = self._staging[stage_slot], self._shards[layer]
        fence = self._copy_lane.submit(lambda: _copy(dst, src), [self._staging_free[stage_slot]])
        self._staged[layer] = (stage_slot, fence)
        return stage_slot, fence

    def _restart_at(self, layer: int) -> None:
        """An acquire out of the expected order (e.g. a forward cut short): wait for what is in flight and
        refill the window starting at ``layer``. Correct in any order; fast only in layer order."""
        self.stats.restarts += 1
        log.debug("weight streamer: layer %d acquired out of order; rebuilding the window", layer)
        for fence in self._ready:
            fence.wait()
        self._staged.clear()
        start = self._pos[layer]
        for slot in range(self.window):
            self._load(self.streamed[(start + slot) % len(self.streamed)], slot)

    # -- introspection -------------------------------------------------------------------------------------
    def device_expert_bytes(self) -> int:
        """Bytes of expert weights this streamer keeps on its device: resident layers, slots, shards, staging."""
        parts = list(self._resident.values()) + self._slots + self._staging
        if self.cfg.mode == "gather":
            parts += list(self._shards.values())
        return sum(p.nbytes for p in parts)

    def layer_timings(self):
        """Per-layer timings recorded since the last call (``timing`` must be on)."""
        if self.timer is None:
            raise RuntimeError("per-layer timing is off (StreamConfig.timing)")
        return self.timer.collect()

    def close(self) -> None:
        for fence in self._ready:
            try:
                fence.wait()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self._copy_lane.close()
        if self._gather_lane is not None:
            self._gather_lane.close()
