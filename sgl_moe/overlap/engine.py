"""Dual micro-batch attention–MoE overlap (seed 004 §3.3.1, Fig. 7): ``DualBatchRunner``.

A batch is split into micro-batches A and B (``Plan``); layer by layer, A's attention runs while B's MoE
runs and vice versa. Two lanes, one per role, each FIFO in issue order (the plan's lead first per layer):
    attention lane:  a_A^0  a_B^0  a_A^1 …      each waits its own micro-batch's MoE of the layer before
    MoE lane:        m_A^0  m_B^0  m_A^1 …      each waits its own micro-batch's attention of the layer
Placements:
- ``sequential``: both roles inline on the caller's thread and stream (the reference);
- ``streams``: two named CUDA streams on one GPU, events (``CudaFence``) travel with the hidden states;
  tensors crossing streams are ``record_stream``-ed so the allocator does not reuse them early;
- ``cpu-experts``: attention on the device (a named stream), routed experts on the CPU in a worker thread
  reading host expert weights; hidden states and routing go device→host into pinned memory behind an event
  the worker synchronises on, the experts' output comes back as a non-blocking copy. The issuing thread
  blocks only when the next attention needs an MoE output that is not ready, and by then the other
  micro-batch's attention is queued on the device.
On a CPU the placements are emulated: ``streams`` by two worker threads, ``cpu-experts`` by the calling
thread (the "GPU") and one worker thread. The embedding and the LM head are shared: the runner takes the
embedded batch and returns the last layer's hidden states (the only synchronisation points).

Exactness: each micro-batch runs the same operations on its rows whatever the placement, so the overlapped
output equals the sequential placement *with the same plan* bit for bit. Against the unsplit batch it agrees
to rounding (fp32 ~1e-6 relative, bf16 ~1e-2): GEMMs of different row counts pick different kernels (a
1-row product is a GEMV) and the grouped expert GEMMs see different token groups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from sgl_moe.overlap.costs import time_call
from sgl_moe.overlap.layers import LayerOps
from sgl_moe.overlap.solver import Placement, Plan
from sgl_moe.streaming.lanes import CudaFence, CudaLane, DoneFence, Fence, Lane, ThreadLane, compute_fence
from sgl_moe.streaming.moe_math import experts_forward

PLACEMENTS: tuple[Placement, ...] = ("sequential", "streams", "cpu-experts")


class DependencyError(RuntimeError):
    """A task ran before the task whose output it reads (a skipped wait)."""


class InlineLane:
    """Runs work on the calling thread (and its current stream) after its fences: the emulated 'GPU'."""

    name = "inline"

    def submit(self, work: Callable[[], None], after: list[Fence]) -> Fence:
        for dep in after:
            dep.wait()
        work()
        return DoneFence()

    def close(self) -> None:
        return None


class HostEventFence:
    """A CUDA event seen from a host thread: ``wait`` blocks that thread (a CPU worker reading device output)."""

    def __init__(self, event: torch.cuda.Event) -> None:
        self.event = event

    def wait(self) -> None:
        self.event.synchronize()

    def done(self) -> bool:
        return self.event.query()


@dataclass
class _MicroBatch:
    """One micro-batch's tensors between tasks; *_layer say which task last wrote them (checked)."""

    rows: slice
    x: torch.Tensor
    h: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    moe: torch.Tensor | None = None
    attn_layer: int = -1
    moe_layer: int = -1


class DualBatchRunner:
    """Runs ``ops``'s layers on a batch as one or two micro-batches on ``placement`` (module docstring).

    ``expert_threads``: torch threads of the CPU experts worker (cpu-experts). ``moe_delay_s`` and
    ``skip_moe_wait`` exist for tests only: a deliberately slow MoE lane, and the negative control that
    drops the attention task's wait for its MoE input (``DependencyError`` is then raised)."""

    def __init__(self, ops: LayerOps, placement: Placement, expert_threads: int | None = None,
                 moe_delay_s: float = 0.0, skip_moe_wait: bool = False) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.ops, self.placement, self.device = ops, placement, ops.device
        self.skip_moe_wait = skip_moe_wait
        cuda = self.device.type == "cuda"
        self.expert_device = torch.device("cpu") if placement == "cpu-experts" else self.device
        self.weights = ops.expert_weights(self.expert_device)
        self.attn: Lane
        self.moe: Lane
        if placement == "sequential":
            self.attn, self.moe = InlineLane(), InlineLane()
        elif placement == "streams":
            if cuda:
                self.attn, self.moe = CudaLane("overlap-attn", self.device), CudaLane("overlap-moe", self.device)
            else:
                self.attn, self.moe = ThreadLane("overlap-attn"), ThreadLane("overlap-moe", moe_delay_s)
        else:
            self.attn = CudaLane("overlap-attn", self.device) if cuda else InlineLane()
            self.moe = ThreadLane("overlap-cpu-experts", moe_delay_s)
            if expert_threads:
                self.moe.submit(partial(torch.set_num_threads, expert_threads), []).wait()
        if moe_delay_s and not isinstance(self.moe, ThreadLane):
            raise ValueError("moe_delay_s needs a thread MoE lane (CPU emulation or cpu-experts)")
        self._active: tuple[Lane, Lane] = (self.attn, self.moe)  # the lanes of the run in progress
        self._modes = (False, torch.is_grad_enabled())  # the caller's (inference, grad) modes of that run

    # -- tasks -------------------------------------------------------------------------------------------
    def _attn_task(self, mb: _MicroBatch, layer: int) -> None:
        x = mb.x
        if layer > 0:
            x = self._add_moe(mb, x, layer - 1)
        self._record(self._active[0], x)
        x = self.ops.attend(layer, x, mb.rows)
        h, w, ids = self.ops.route(layer, x)
        if self.expert_device != self.device:
            h, w, ids = (self._to_host(t) for t in (h, w, ids))
        mb.x, mb.h, mb.attn_layer = x, (h, w, ids), layer

    def _moe_task(self, mb: _MicroBatch, layer: int) -> None:
        if mb.attn_layer != layer or mb.h is None:
            raise DependencyError(f"MoE of layer {layer} ran before its attention (attention at {mb.attn_layer})")
        h, w, ids = mb.h
        self._record(self._active[1], h, w, ids)
        out = experts_forward(h, w, ids, self.weights[layer])
        if self.expert_device != self.device and self.device.type == "cuda":
            pinned = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            out = pinned.copy_(out)
        mb.moe, mb.moe_layer = out, layer

    def _finish_task(self, mb: _MicroBatch, out: torch.Tensor, layers: int) -> None:
        out[mb.rows] = self._add_moe(mb, mb.x, layers - 1)

    def _add_moe(self, mb: _MicroBatch, x: torch.Tensor, layer: int) -> torch.Tensor:
        if mb.moe_layer != layer or mb.moe is None:
            raise DependencyError(f"attention read the MoE output of layer {layer} before it was written "
                                  f"(last written: layer {mb.moe_layer})")
        moe = mb.moe
        if moe.device != x.device:
            moe = moe.to(x.device, non_blocking=True)  # pinned host → device on the attention stream
        self._record(self._active[0], moe)
        return x + moe.view_as(x)

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu":
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return host.copy_(t, non_blocking=True)  # completes with the attention task's event

    @staticmethod
    def _record(lane: Lane, *tensors: torch.Tensor) -> None:
        """A tensor made on another stream is used on ``lane``'s: keep the allocator from reusing it early."""
        if isinstance(lane, CudaLane):
            for t in tensors:
                if t.device.type == "cuda":
                    t.record_stream(lane.stream)

    def _cross(self, fence: Fence) -> Fence:
        """The attention fence as the MoE lane must wait it (a host thread waits a CUDA event by blocking)."""
        if isinstance(fence, CudaFence) and not isinstance(self._active[1], CudaLane):
            return HostEventFence(fence.event)
        return fence

    # -- the pipeline ------------------------------------------------------------------------------------
    def run(self, x: torch.Tensor, plan: Plan | None = None, serial: bool = False) -> torch.Tensor:
        """x [B, ...] (embedded) → the last layer's hidden states, same shape; one run at a time. ``plan``
        None, or a plan whose overlap is off, runs the batch as one micro-batch: on ``streams`` inline on the
        caller's stream, on ``cpu-experts`` device and CPU in turn (the seed's baseline).
        ``serial``: the plan's micro-batches and tasks, but each attention also waits the MoE issued before
        it, so nothing overlaps (the bit-exact reference of the overlapped run on any placement)."""
        if plan is not None and plan.overlap and plan.split.overlap:
            ra, rb = plan.split.rows()
            if rb.stop != x.shape[0]:
                raise ValueError(f"plan for {rb.stop} sequences, batch has {x.shape[0]}")
            mbs = [_MicroBatch(ra, x[ra]), _MicroBatch(rb, x[rb])]
            if plan.order == "ba":
                mbs.reverse()
        else:
            mbs = [_MicroBatch(slice(0, x.shape[0]), x)]
        # One micro-batch on ``streams``: nothing to overlap, so no lanes either (the caller's stream).
        inline = len(mbs) == 1 and self.placement == "streams"
        attn, moe = self._active = (InlineLane(), InlineLane()) if inline else (self.attn, self.moe)
        # Grad and inference modes are thread-local: worker threads run the tasks in the caller's (a server
        # runs its forward under inference_mode; its KV cache must not be written with autograd on).
        self._modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        try:
            return self._issue(mbs, x, attn, moe, serial)
        finally:
            self._active = (self.attn, self.moe)

    def _task(self, fn: Callable[..., None], *args) -> Callable[[], None]:
        inference, grad = self._modes

        def work() -> None:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                fn(*args)

        return work

    def _issue(self, mbs: list[_MicroBatch], x: torch.Tensor, attn: Lane, moe: Lane, serial: bool
               ) -> torch.Tensor:
        layers = self.ops.cfg.layers
        out = torch.empty_like(x)
        start = compute_fence(self.device)  # the embedding (and out's allocation) on the caller's stream
        moe_done: dict[int, Fence] = {i: start for i in range(len(mbs))}
        last: Fence = start
        for layer in range(layers):
            for i, mb in enumerate(mbs):
                wait = [start] if layer == 0 else ([] if self.skip_moe_wait else [moe_done[i]])
                if serial:
                    wait.append(last)
                attn_done = attn.submit(self._task(self._attn_task, mb, layer), wait)
                moe_done[i] = last = moe.submit(self._task(self._moe_task, mb, layer), [self._cross(attn_done)])
        finished = [attn.submit(self._task(self._finish_task, mb, out, layers), [moe_done[i]])
                    for i, mb in enumerate(mbs)]
        for fence in finished:
            fence.wait()  # CUDA: the caller's stream waits (the LM head is the next consumer); CPU: blocks
        return out

    def time_tasks(self, rows: slice, reps: int = 5, x: torch.Tensor | None = None) -> tuple[float, float]:
        """Seconds of one attention task and one MoE task (layer 0) for ``rows`` of ``x`` (default: the ops'
        inputs), each alone, on this placement's lanes (cpu-experts: the device→host copies are in the
        attention task)."""
        x0 = (self.ops.inputs() if x is None else x)[rows]
        mb = _MicroBatch(rows, x0)
        self._modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())

        def attn() -> None:
            mb.x = x0  # every rep attends the same input (the task replaces mb.x with its output)
            self.attn.submit(self._task(self._attn_task, mb, 0), [compute_fence(self.device)]).wait()

        def moe() -> None:
            self.moe.submit(self._task(self._moe_task, mb, 0), [self._cross(compute_fence(self.device))]).wait()

        t_attn = time_call(attn, self.device, reps=reps)
        t_moe = time_call(moe, self.device, reps=reps)
        return t_attn, t_moe

    def time_concurrent(self, rows_a: slice, rows_b: slice, reps: int = 5, x: torch.Tensor | None = None) -> float:
        """Seconds of A's attention and B's MoE issued together (what the overlap efficiency η is made of)."""
        x = self.ops.inputs() if x is None else x
        a, b = _MicroBatch(rows_a, x[rows_a]), _MicroBatch(rows_b, x[rows_b])
        self._modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        self.attn.submit(self._task(self._attn_task, b, 0), [compute_fence(self.device)]).wait()

        def both() -> None:
            start = compute_fence(self.device)
            # The MoE first: an inline attention lane (cpu-experts emulated on a CPU) runs at submit.
            fb = self.moe.submit(self._task(self._moe_task, b, 0), [self._cross(start)])
            fa = self.attn.submit(self._task(self._attn_task, a, 0), [start])
            fa.wait()
            fb.wait()

        return time_call(both, self.device, reps=reps)

    def overlap_efficiency(self, rows_a: slice, rows_b: slice, reps: int = 5, x: torch.Tensor | None = None
                           ) -> float:
        """η ∈ [0, 1]: the share of the shorter of (A's attention, B's MoE) hidden when both are issued
        together (1: the two resources are independent; 0: they serialise, e.g. kernels that already fill
        one GPU, or two cores that share one memory bus)."""
        t_a = self.time_tasks(rows_a, reps, x)[0]
        t_m = self.time_tasks(rows_b, reps, x)[1]
        both = self.time_concurrent(rows_a, rows_b, reps, x)
        return min(1.0, max(0.0, (t_a + t_m - both) / min(t_a, t_m))) if min(t_a, t_m) > 0 else 0.0

    def close(self) -> None:
        self.attn.close()
        self.moe.close()
