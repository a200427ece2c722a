"""Lanes: ordered executors for background work (a CUDA stream on a GPU, a worker thread on a CPU).

Work is submitted with the fences it depends on and returns a fence for its completion; a fence travels with
the buffer it guards. ``Fence.wait()`` makes the *current* stream wait (CUDA: no host block) or blocks the
calling thread (CPU). No synchronize happens in the hot path on a GPU.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

import torch


class LaneError(RuntimeError):
    """Background work failed; raised where its fence is waited on."""


class Fence(Protocol):
    def wait(self) -> None:
        """Make the current stream (CUDA) or thread (CPU) wait until the guarded work is complete."""

    def done(self) -> bool:
        """True once the work is complete (never blocks)."""


class DoneFence:
    """Work that is already complete (CPU compute is synchronous)."""

    def wait(self) -> None:
        return None

    def done(self) -> bool:
        return True


class ThreadFence:
    def __init__(self, lane: str = "background") -> None:
        self.lane = lane
        self._event = threading.Event()
        self._error: BaseException | None = None

    def set(self, error: BaseException | None = None) -> None:
        self._error = error
        self._event.set()

    def wait(self) -> None:
        self._event.wait()
        if isinstance(self._error, LaneError):
            raise self._error  # a dependency's failure, passed on unwrapped: one message, the original cause
        if self._error is not None:
            raise LaneError(f"{self.lane} lane task failed: {self._error!r}") from self._error

    def done(self) -> bool:
        return self._event.is_set()


class CudaFence:
    def __init__(self, event: torch.cuda.Event) -> None:
        self.event = event

    def wait(self) -> None:
        torch.cuda.current_stream().wait_event(self.event)

    def done(self) -> bool:
        return self.event.query()


class Lane(Protocol):
    name: str

    def submit(self, work: Callable[[], None], after: list[Fence]) -> Fence:
        """Run ``work`` after every fence in ``after``, in submission order; return its completion fence."""

    def close(self) -> None: ...


class ThreadLane:
    """A FIFO worker thread. torch's copy and gloo collectives release the GIL, so work overlaps compute.

    ``delay_s`` sleeps before each job: tests use it to make transfers deliberately slow.
    """

    def __init__(self, name: str, delay_s: float = 0.0) -> None:
        self.name = name
        self.delay_s = delay_s
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"sgl_moe-{name}", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None], after: list[Fence]) -> Fence:
        fence = ThreadFence(self.name)
        self._jobs.put((work, list(after), fence))
        return fence

    def _run(self) -> None:
        torch.set_num_threads(1)  # one core's worth of memcpy; compute keeps the others
        while True:
            job = self._jobs.get()
            if job is None:
                return
            work, after, fence = job
            try:
                for dep in after:
                    dep.wait()
                if self.delay_s:
                    time.sleep(self.delay_s)
                work()
            except BaseException as exc:  # reported to whoever waits on the fence
                fence.set(exc)
            else:
                fence.set()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)


class CudaLane:
    """A dedicated CUDA stream; dependencies become ``wait_event`` on it, completion an event recorded on it."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self.stream = torch.cuda.Stream(device=device)

    def submit(self, work: Callable[[], None], after: list[Fence]) -> Fence:
        with torch.cuda.stream(self.stream):
            for dep in after:
                dep.wait()
            work()
            event = torch.cuda.Event()
            event.record(self.stream)
        return CudaFence(event)

    def close(self) -> None:
        self.stream.synchronize()


def compute_fence(device: torch.device) -> Fence:
    """A fence for the compute work issued so far on the current stream (what a slot's reuse waits for)."""
    if device.type == "cuda":
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return CudaFence(event)
    return DoneFence()


def make_lane(name: str, device: torch.device, delay_s: float = 0.0) -> Lane:
    if device.type == "cuda":
        if delay_s:
            raise ValueError("a deliberate transfer delay exists only for CPU lanes (tests)")
        return CudaLane(name, device)
    return ThreadLane(name, delay_s)
