"""The decode offload engine: two device buffers of expert slots, filled from the host store per layer.

Seed 003 §5.1, Algorithm 1 with double buffering. Experts of every layer live in the host store (pinned
when CUDA is used); per-layer *resident* experts stay on the device for good. Layer l runs on buffer l % 2
(``capacity`` slots of w13/w2 each, allocated once). Protocol, per layer, in this order:

- ``w, slots = acquire(l, ids)``: every expert of ``ids`` [T, k] made present in buffer l % 2; ``slots`` are
  ``ids`` remapped to slot rows of ``w``. Prefetched experts are hits (not copied again); resident experts
  are copied device-to-device into the buffer; the rest (misses) are fetched from the host in one batched
  copy, queued on the copy lane *before* any prefetch of l+1 so the critical-path copy goes first.
- ``prefetch(l + 1, predicted_ids)``: the batched host copy of layer l+1's predicted experts into the other
  buffer, on the copy lane, after the compute fence of that buffer's previous user (layer l−1); returns at
  once, so the copy overlaps layer l's experts and layer l+1's attention and router.
- ``release(l)``: records the compute fence of buffer l % 2.

Design choices stated plainly:
- Resident experts are *copied* into the buffer (device-to-device, ~3 TB/s vs ~50 GB/s over PCIe) rather
  than read in place, so each layer's experts are one weight tensor pair and an unmodified fused-MoE kernel
  (SGLang's) runs on (buffer, slots). The price is a D2D copy per needed resident expert per step and two
  buffers' worth of device memory on top of the residents.
- Which expert sits in which slot is host bookkeeping, so ``ids`` are read on the host once per layer
  (a device→host sync on a GPU). That makes this path not CUDA-graph-capturable. It is the one sync per
  layer: ``read_ids`` reads the layer's routed ids and the next layer's predicted ids in one copy, and
  ``acquire`` takes them (``host_ids``); the slot map goes back to the device from pinned memory without
  blocking. Without ``host_ids`` ``acquire`` reads ``ids`` itself (callers that predict elsewhere); a gather
  driven by device-side indices could remove the read later.
- The batched copy is ``torch._foreach_copy_`` over row views (one Python call per layer and direction).
  From pinned host to device torch has no fused kernel for it: the C++ loop issues one asynchronous DMA per
  expert row straight from the pinned store (no staging memcpy, no host block). That is what any H2D copy of
  scattered rows costs; at Qwen3-30B-A3B sizes a row is 3.1 MB (w2) or 6.3 MB (w13), so a copy call's
  few microseconds are a few percent of its ~60-120 µs transfer (the GPU probe measures rows vs one copy).

``on_demand`` makes ``prefetch`` a no-op, so one caller drives all three executions. Callers should read
the next layer's predicted ids to the host *before* ``acquire`` (as ``DecodeStack`` does): after ``acquire``
the compute stream waits for the copy, so a device→host read there would block the host until it lands.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

import torch

from sgl_moe.offload.config import OffloadConfig
from sgl_moe.streaming.expert_store import ExpertStore, LayerWeights
from sgl_moe.streaming.lanes import DoneFence, Fence, compute_fence, make_lane
from sgl_moe.streaming.layer_timer import LayerTimer

log = logging.getLogger("sgl_moe.offload")


class OffloadCapacityError(RuntimeError):
    """A layer needs more distinct experts at once than a buffer has slots."""


@dataclass
class OffloadStats:
    acquires: int = 0
    """Layers acquired (steps × layers)."""
    prefetched: int = 0
    """Experts copied from the host by ``prefetch``."""
    hits: int = 0
    """Needed non-resident experts already in the buffer at ``acquire`` (prefetched, or still there)."""
    misses: int = 0
    """Needed non-resident experts fetched from the host at ``acquire`` (on the critical path)."""
    resident_hits: int = 0
    """Needed experts that are resident on the device."""
    experts_copied: int = 0
    """Experts copied host→device (prefetched + misses)."""
    bytes_moved: int = 0
    """Host→device bytes (experts_copied × expert bytes)."""
    d2d_experts: int = 0
    """Resident experts copied device→device into a buffer."""

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_FOREACH_OK: dict[tuple[str, str], bool] = {}


def gather_rows(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """The batched copy: ``dst[i] ← src[i]`` for row views, one call (async from pinned memory on CUDA).

    ``torch._foreach_copy_`` where this torch accepts the device pair (checked on first use), else a loop."""
    if not dst:
        return
    key = (dst[0].device.type, src[0].device.type)
    copy = getattr(torch, "_foreach_copy_", None)
    if copy is not None and _FOREACH_OK.get(key, True):
        try:
            copy(dst, src, non_blocking=True)
        except (RuntimeError, NotImplementedError):
            if _FOREACH_OK.get(key):
                raise  # worked before for this device pair: a real failure
            _FOREACH_OK[key] = False
        else:
            _FOREACH_OK[key] = True
            return
    for d, s in zip(dst, src):
        d.copy_(s, non_blocking=True)


class _Buffer:
    """One device buffer: slot tensors, which layer's experts it holds, and the fences guarding it."""

    def __init__(self, like: LayerWeights, capacity: int, device: torch.device) -> None:
        self.weights = LayerWeights(
            torch.empty((capacity, *like.w13.shape[1:]), dtype=like.w13.dtype, device=device),
            torch.empty((capacity, *like.w2.shape[1:]), dtype=like.w2.dtype, device=device))
        self.rows13 = list(self.weights.w13.unbind(0))
        self.rows2 = list(self.weights.w2.unbind(0))
        self.layer: int | None = None
        self.slot_of: dict[int, int] = {}  # expert id → slot; experts of ``layer`` only
        self.ready: Fence = DoneFence()  # last copy into the buffer (copy lane)
        self.free: Fence = DoneFence()  # last compute reading the buffer (``release``)

    def hold(self, layer: int) -> None:
        """Start holding ``layer``'s experts (forget another layer's)."""
        if self.layer != layer:
            self.layer = layer
            self.slot_of = {}

    def take_slots(self, experts: list[int], keep: set[int]) -> list[int]:
        """Assign free slots to ``experts``, evicting held experts not in ``keep``."""
        used = {s for e, s in self.slot_of.items() if e in keep}
        free = [s for s in range(len(self.rows13)) if s not in used]
        if len(experts) > len(free):
            raise OffloadCapacityError(f"layer {self.layer} needs {len(keep)} distinct experts at once but a "
                                       f"buffer has {len(self.rows13)} slots (raise OffloadConfig.capacity)")
        self.slot_of = {e: s for e, s in self.slot_of.items() if e in keep}
        for e, s in zip(experts, free):
            self.slot_of[e] = s
        return free[:len(experts)]


def _host_unique(ids: torch.Tensor) -> tuple[list[int], list[int]]:
    """Distinct expert ids of ``ids`` and their counts, on the host (a device→host read if ``ids`` is not)."""
    uniq, counts = torch.unique(ids.detach().reshape(-1).cpu(), return_counts=True)
    return uniq.tolist(), counts.tolist()


def read_ids(*ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Host copies of expert id tensors in one device→host copy (one sync), shapes kept, as int64.

    Host tensors are returned as they are (no copy)."""
    if all(t.device.type == "cpu" for t in ids):
        return ids
    flat = torch.cat([t.detach().reshape(-1).to(torch.int64) for t in ids]).cpu()
    out, start = [], 0
    for t in ids:
        out.append(flat[start:start + t.numel()].view(t.shape))
        start += t.numel()
    return tuple(out)


def _to_device(values: list[int], like: torch.Tensor) -> torch.Tensor:
    """A small host list as a tensor on ``like``'s device; on a GPU through pinned memory, not blocking (a
    pageable copy would wait for everything queued on the stream). The caching host allocator keeps the
    pinned block until the copy is done."""
    t = torch.tensor(values, dtype=like.dtype)
    if like.device.type == "cuda":
        return t.pin_memory().to(like.device, non_blocking=True)
    return t.to(like.device)


class OffloadEngine:
    def __init__(self, store: ExpertStore, cfg: OffloadConfig, device: torch.device | str,
                 resident: dict[int, list[int]] | None = None, copy_delay_s: float = 0.0) -> None:
        self.device = torch.device(device)
        self.num_layers = len(store)
        self.num_experts = store[0].num_experts
        cfg.validate(self.num_experts)
        self.cfg = cfg
        self.capacity = cfg.slots(self.num_experts)
        if self.device.type == "cuda" and cfg.pin_memory and not store[0].w13.is_pinned():
            store = ExpertStore.to_host(store.layers, pin=True)
        self.store = store
        self.expert_bytes = store.layer_bytes // self.num_experts
        self.stats = OffloadStats()
        self.timer = LayerTimer(self.device) if cfg.timing else None
        # Row views of the host store, made once: a batched copy only picks from these lists.
        self._src = [(list(layer.w13.unbind(0)), list(layer.w2.unbind(0))) for layer in store.layers]

        self._resident_rows: dict[int, dict[int, int]] = {}
        self._resident: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self._resident_weights: list[LayerWeights] = []
        for layer, experts in sorted((resident or {}).items()):
            if not 0 <= layer < self.num_layers:
                raise ValueError(f"resident experts given for layer {layer}; the store has {self.num_layers} layers")
            experts = sorted(set(experts))
            if experts and not (0 <= experts[0] and experts[-1] < self.num_experts):
                raise ValueError(f"resident expert ids of layer {layer} must be in [0, {self.num_experts})")
            if not experts:
                continue
            idx = torch.tensor(experts)
            w = LayerWeights(store[layer].w13.index_select(0, idx).to(self.device),
                             store[layer].w2.index_select(0, idx).to(self.device))
            self._resident_weights.append(w)
            self._resident_rows[layer] = {e: i for i, e in enumerate(experts)}
            self._resident[layer] = (list(w.w13.unbind(0)), list(w.w2.unbind(0)))

        self._buffers = [_Buffer(store[0], self.capacity, self.device) for _ in range(2)]
        self._lane = make_lane("expert-offload", self.device, copy_delay_s)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # residents in place before any stream reads
        log.info("offload engine: %s, %d layers × %d experts (%.1f MB each), 2 buffers × %d slots, %d resident "
                 "experts, %.2f GB of experts on %s", cfg.execution, self.num_layers, self.num_experts,
                 self.expert_bytes / 1e6, self.capacity, sum(len(r) for r in self._resident_rows.values()),
                 self.device_expert_bytes() / 1e9, self.device)

    # -- protocol ------------------------------------------------------------------------------------------
    def acquire(self, layer: int, ids: torch.Tensor, host_ids: torch.Tensor | None = None
                ) -> tuple[LayerWeights, torch.Tensor]:
        """Buffer ``layer % 2`` holding every expert of ``ids`` [T, k], and ``ids`` remapped to its slots.

        ``host_ids``: the same ids already on the host (``read_ids``), so that acquire reads nothing back."""
        if self.timer:
            self.timer.enter(layer)
        buf = self._buffers[layer % 2]
        buf.hold(layer)
        needed, _ = _host_unique(ids if host_ids is None else host_ids)
        resident_rows = self._resident_rows.get(layer, {})
        missing = [e for e in needed if e not in buf.slot_of]
        from_host = [e for e in missing if e not in resident_rows]
        from_device = [e for e in missing if e in resident_rows]
        slots = buf.take_slots(from_host + from_device, keep=set(needed))  # raises before any state changes
        n_resident = sum(1 for e in needed if e in resident_rows)
        self.stats.acquires += 1
        self.stats.resident_hits += n_resident
        self.stats.hits += len(needed) - n_resident - len(from_host)
        self.stats.misses += len(from_host)
        # The slot map is known on the host before the data lands: send it now (pinned, non-blocking on a GPU).
        lut = [0] * self.num_experts
        for e in needed:
            lut[e] = buf.slot_of[e]
        slot_ids = _to_device(lut, ids)[ids]
        if from_host:
            # Queued on the copy lane ahead of the prefetch of layer+1: the critical-path copy goes first.
            self._copy_from_host(buf, layer, from_host, slots[:len(from_host)])
        buf.ready.wait()  # prefetch and misses (the lane is FIFO); a wait_event on a GPU, no host block
        if from_device:
            # On the compute stream, after the wait: ordered behind the copies and the last reader of the slots.
            rows13, rows2 = self._resident[layer]
            dst = slots[len(from_host):]
            gather_rows([buf.rows13[s] for s in dst] + [buf.rows2[s] for s in dst],
                        [rows13[resident_rows[e]] for e in from_device]
                        + [rows2[resident_rows[e]] for e in from_device])
            self.stats.d2d_experts += len(from_device)
        if self.timer:
            self.timer.ready(layer)
        return buf.weights, slot_ids

    def prefetch(self, layer: int, ids: torch.Tensor) -> None:
        """Start copying the distinct experts of ``ids`` into buffer ``layer % 2``; returns at once.

        No-op for ``on_demand`` and past the last layer. Resident experts are left to ``acquire`` (D2D).
        With more predicted experts than slots, the most often predicted ones are copied."""
        if self.cfg.execution == "on_demand" or layer >= self.num_layers:
            return
        buf = self._buffers[layer % 2]
        buf.hold(layer)
        predicted, counts = _host_unique(ids)
        resident_rows = self._resident_rows.get(layer, {})
        count_of = dict(zip(predicted, counts))
        ranked = sorted((e for e in predicted if e not in resident_rows), key=lambda e: -count_of[e])[:self.capacity]
        todo = sorted(e for e in ranked if e not in buf.slot_of)
        if not todo:
            return
        # Keep what the buffer already holds of this layer while it fits; else only the predicted experts.
        fits = len(buf.slot_of) + len(todo) <= self.capacity
        slots = buf.take_slots(todo, keep=set(buf.slot_of) | set(ranked) if fits else set(ranked))
        self.stats.prefetched += len(todo)
        self._copy_from_host(buf, layer, todo, slots)

    def release(self, layer: int) -> None:
        """The compute reading buffer ``layer % 2`` has been issued; later copies into it wait for it."""
        self._buffers[layer % 2].free = compute_fence(self.device)
        if self.timer:
            self.timer.exit(layer)

    # -- transfers -----------------------------------------------------------------------------------------
    def _copy_from_host(self, buf: _Buffer, layer: int, experts: list[int], slots: list[int]) -> Fence:
        """One batched host→device copy of ``experts`` into ``slots`` on the copy lane, after the buffer's
        last compute (and, by lane order, its previous copies); the fence becomes the buffer's ``ready``."""
        src13, src2 = self._src[layer]
        dst = [buf.rows13[s] for s in slots] + [buf.rows2[s] for s in slots]
        src = [src13[e] for e in experts] + [src2[e] for e in experts]
        buf.ready = self._lane.submit(lambda: gather_rows(dst, src), [buf.free])
        self.stats.experts_copied += len(experts)
        self.stats.bytes_moved += len(experts) * self.expert_bytes
        return buf.ready

    # -- introspection -------------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        self.stats = OffloadStats()

    def device_expert_bytes(self) -> int:
        """Expert bytes on the device: the two buffers and the resident experts."""
        return sum(b.weights.nbytes for b in self._buffers) + sum(w.nbytes for w in self._resident_weights)

    def resident_experts(self, layer: int) -> list[int]:
        return sorted(self._resident_rows.get(layer, {}))

    def layer_timings(self):
        """Per-layer timings recorded since the last call (``OffloadConfig.timing`` must be on)."""
        if self.timer is None:
            raise RuntimeError("per-layer timing is off (OffloadConfig.timing)")
        return self.timer.collect()

    def close(self) -> None:
        for buf in self._buffers:
            try:
                buf.ready.wait()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self._lane.close()
