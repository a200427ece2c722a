"""Run SGLang 0.5.23 on CPUs without AMX and without CUDA.

What it takes (measured, see the project notes): SGLang's CPU engine is chosen only when the
environment has ``SGLANG_USE_CPU_ENGINE=1`` together with ``--device cpu``; the torch-native attention
backend and no CUDA graphs; and ``import sgl_kernel`` must succeed although the PyPI wheel needs
``libcuda.so.1``. This module decides whether that is needed (``probe``), and applies it to the
current process and, through the environment, to every process SGLang spawns (``CompatPlan.apply``).

It is inert on a GPU machine: with a usable CUDA device nothing is changed, and the stand-in
``sgl_kernel`` is only put on the path when the real one fails to import.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

STUB_DIR = Path(__file__).resolve().parent / "stub"
"""Directory holding the stand-in ``sgl_kernel`` package; prepended to the path when needed."""

CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"

CPU_REQUIRED_SERVER_ARGS: dict[str, object] = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "disable_cuda_graph": True,
}
"""SGLang server arguments the CPU engine requires (ServerArgs field -> value); the launcher refuses others."""


@dataclass(frozen=True)
class CompatPlan:
    """What must be done to run SGLang on this machine."""

    cpu_engine: bool
    """No usable CUDA device: select SGLang's CPU engine and its CPU-safe server arguments."""
    stand_in_kernel: bool
    """The real ``sgl_kernel`` does not import: put the stand-in first on the path."""
    reason: str
    """Why, for the logs."""
    required_server_args: dict[str, object] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.cpu_engine or self.stand_in_kernel

    def apply(self, environ: dict[str, str] | None = None) -> None:
        """Make the plan effective here and in every child process (they inherit ``environ``)."""
        env = os.environ if environ is None else environ
        if self.cpu_engine:
            env[CPU_ENGINE_ENV] = "1"
        if self.stand_in_kernel:
            stub = str(STUB_DIR)
            parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != stub]
            env["PYTHONPATH"] = os.pathsep.join([stub, *parts])
            if environ is None:
                if stub not in sys.path:
                    sys.path.insert(0, stub)
                # A failed import of the real library may have left partial modules behind.
                for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
                    del sys.modules[name]
                importlib.invalidate_caches()
        if self.active:
            logger.info("CPU compatibility layer active: %s", self.reason)


def decide(cuda_usable: bool, kernel_import_error: str | None) -> CompatPlan:
    """Pure decision: given what the machine offers, what must the layer do."""
    if cuda_usable:
        return CompatPlan(False, False, "a CUDA device is usable: SGLang runs unchanged")
    if kernel_import_error is None:
        return CompatPlan(
            True, False, "no usable CUDA device; the real sgl_kernel imports, so it is used as is",
            dict(CPU_REQUIRED_SERVER_ARGS),
        )
    return CompatPlan(
        True, True, f"no usable CUDA device and sgl_kernel fails to import ({kernel_import_error}); "
        "using the stand-in", dict(CPU_REQUIRED_SERVER_ARGS),
    )


def cuda_usable() -> bool:
    import torch

    try:
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # a broken driver counts as no device
        return False


def _one_line(exc: BaseException) -> str:
    """sgl_kernel's ImportError is a multi-line report; keep the line that says what is missing."""
    lines = [line.strip(" -") for line in str(exc).splitlines() if line.strip()]
    detail = next((line for line in lines if "cannot open shared object" in line), lines[0] if lines else "")
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def real_kernel_import_error() -> str | None:
    """Try to import the real ``sgl_kernel``; return the error text, or None if it imports."""
    try:
        module = importlib.import_module("sgl_kernel")
    except Exception as exc:  # ImportError, OSError from a missing libcuda, ...
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]
        return _one_line(exc)
    if getattr(module, "SGL_MOE_STAND_IN", False):
        return "only the stand-in is on the path"
    return None


def probe() -> CompatPlan:
    """Inspect this machine and return the plan (imports torch; call from heavy processes only)."""
    if cuda_usable():
        return decide(True, None)
    return decide(False, real_kernel_import_error())
