"""GPU measurement helpers shared by the GPU tests and the probe (tools/gpu_probe.py): a compute load of a
chosen length on the current stream, and a count of the synchronizing CUDA calls a piece of code makes.

Method (the device notes): warm up first, time with CUDA events on the streams involved, read them only
after a synchronize, take medians. Torch only.
"""

from __future__ import annotations

import os
import statistics
import warnings
from collections.abc import Callable

import torch

TEST_DEVICE_ENV = "SGL_MOE_GPU_TEST_DEVICE"
SYNC_WARNING = "called a synchronizing CUDA operation"
"""The text of the warning torch's sync debug mode gives for each synchronizing call."""


def gpu_test_device() -> str:
    """The device of the ``gpu``-marked tests: ``cuda``; ``SGL_MOE_GPU_TEST_DEVICE=cpu`` runs their
    device-independent cases on the CPU (a dry run of the tests' code, used by the smoke suite)."""
    device = os.environ.get(TEST_DEVICE_ENV, "cuda")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"{TEST_DEVICE_ENV} must be cuda or cpu, got {device!r}")
    return device


def event() -> torch.cuda.Event:
    """A timing event recorded now on the current stream."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def time_cuda(fn: Callable[[], object], reps: int = 10, warmup: int = 2) -> float:
    """Median seconds of ``fn`` between CUDA events on the current stream (warm-up runs excluded)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = event()
        fn()
        b = event()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


class ComputeLoad:
    """Back-to-back bf16 (float32 where bf16 is missing) matrix products on the current stream, on random
    operands, sized to last about ``seconds`` once ``calibrate`` has timed one product."""

    def __init__(self, device: torch.device, n: int = 4096) -> None:
        gen = torch.Generator(device=device).manual_seed(0)
        self.a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
        self.b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen) / n ** 0.5
        self.out = torch.empty_like(self.a)
        self.one_s = time_cuda(lambda: torch.matmul(self.a, self.b, out=self.out), reps=5)

    def issue(self, seconds: float) -> int:
        """Queue products for about ``seconds`` on the current stream; returns how many (at least 1)."""
        count = max(1, round(seconds / self.one_s))
        for _ in range(count):
            torch.matmul(self.a, self.b, out=self.out)
        return count


def count_syncs(fn: Callable[[], object]) -> tuple[int, object]:
    """(synchronizing CUDA calls ``fn`` made, its result), from torch's sync debug mode in 'warn'."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    # Only torch's per-call report counts: "called a synchronizing CUDA operation". Switching the mode on also
    # warns once per process that the mode "is a prototype feature", a message that names synchronization
    # too (on an H100, torch 2.11, it was once counted as a sync and failed the no-sync test).
    n = sum(1 for w in caught if SYNC_WARNING in str(w.message))
    return n, result
