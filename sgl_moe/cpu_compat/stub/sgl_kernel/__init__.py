"""Stand-in for ``sgl_kernel`` on machines where the real wheel cannot load (no CUDA driver).

Put on the path by ``sgl_moe.cpu_compat`` only when no CUDA device is usable *and* the real
``sgl_kernel`` failed to import, so it never shadows the real library on a GPU machine.

SGLang's CPU engine on CPUs without AMX runs on plain torch ops, but it imports ``sgl_kernel``
and looks names up at start-up. Every attribute (and every submodule) of this stand-in resolves,
so imports succeed; calling any of them raises ``MissingKernelError`` naming the kernel, so a code
path that truly needs a compiled kernel fails loudly instead of hanging or crashing obscurely.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

SGL_MOE_STAND_IN = True
"""Marker: lets tests and logs tell the stand-in from the real library."""


class MissingKernelError(RuntimeError):
    """A compiled sgl_kernel function was called on a machine where only the stand-in exists."""


class MissingKernel:
    """Placeholder for a name in sgl_kernel: attribute chains resolve, calling raises.

    SGLang reads some names at import time without calling them (e.g. ``scalar_types.uint4b8``
    in quantization tables); those must resolve. Only a call means a kernel is really needed.
    """

    __slots__ = ("_qualname",)

    def __init__(self, qualname: str):
        object.__setattr__(self, "_qualname", qualname)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return MissingKernel(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise MissingKernelError(
            f"sgl_kernel kernel '{self._qualname}' was called, but this machine has no usable CUDA device and "
            f"sgl_moe's CPU compatibility layer does not provide it. The SGLang code path that needs it "
            f"is not supported on this CPU; disable the feature that uses it."
        )

    def __repr__(self) -> str:
        return f"<missing sgl_kernel kernel {self._qualname}>"


def _make_getattr(prefix: str):
    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return MissingKernel(f"{prefix}{name}")

    return __getattr__


__getattr__ = _make_getattr("")


class _StubSubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``sgl_kernel.<anything>`` to an empty module whose attributes are missing kernels."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _make_getattr(spec.name[len("sgl_kernel.") :] + ".")
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _StubSubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_StubSubmoduleFinder())
