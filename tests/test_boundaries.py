"""Import boundaries between the parts, as one table: what each part may never import (checked in a fresh
interpreter that imports every module of the part, so a lazy import inside a function is allowed)."""

import subprocess
import sys

import pytest

LIGHT = ("torch", "sglang", "transformers")
ROUTER = ("torch", "sglang")
"""The router loads its tokenizer with transformers (lazily, without torch: ``router_tokenizer.keep_torch_out``)."""
GPU_IMAGE_LACKS = ("sglang", "orjson", "msgspec", "zmq")
"""The GPU machine has torch, triton and transformers but none of these: the engines run there alone."""

BOUNDARIES = [
    ("sgl_moe.router", ROUTER, "the router is the light process users expose"),
    ("sgl_moe.wire", LIGHT + ("msgspec",), "every process reads it, the torch-only engines included"),
    ("sgl_moe.flops", LIGHT, "the router computes FLOPs with it"),
    ("sgl_moe.saturation", LIGHT, "pure arithmetic shared by worker and simulator"),
    ("sgl_moe.cli_args", LIGHT, "every entry point builds its flags with it"),
    ("sgl_moe.worker", ("torch", "sglang"), "the launcher checks its input before importing SGLang"),
    ("sgl_moe.classify", LIGHT, "a client of the router"),
    ("sgl_moe.workloads", LIGHT, "request generation for clients and the simulator"),
    ("sgl_moe.simulator", ("torch", "sglang"), "simulates the real router in-process"),
    ("sgl_moe.streaming", GPU_IMAGE_LACKS, "engine: driven by torch alone on a GPU machine"),
    ("sgl_moe.offload", GPU_IMAGE_LACKS, "engine: driven by torch alone on a GPU machine"),
    ("sgl_moe.overlap", GPU_IMAGE_LACKS, "engine: driven by torch alone on a GPU machine"),
    ("sgl_moe.prediction", GPU_IMAGE_LACKS, "engine: driven by torch alone on a GPU machine"),
]

CODE = """
import importlib, pkgutil, sys
name, forbidden = sys.argv[1], sys.argv[2].split(",")
root = importlib.import_module(name)
for m in pkgutil.walk_packages(getattr(root, "__path__", []), name + "."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
loaded = sorted({n.split(".")[0] for n in sys.modules} & set(forbidden))
print(",".join(loaded))
"""


@pytest.mark.parametrize("part,forbidden,why", BOUNDARIES, ids=[b[0] for b in BOUNDARIES])
def test_part_imports_nothing_forbidden(part, forbidden, why):
    result = subprocess.run([sys.executable, "-c", CODE, part, ",".join(forbidden)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = result.stdout.strip()
    assert not loaded, f"{part} imports {loaded}; it must not ({why})"


ROUTER_PROCESS = """
import sys
from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.router.request.router_tokenizer import RouterTokenizer, keep_torch_out
keep_torch_out()
tok = RouterTokenizer.from_dir(DEFAULT_MODEL_DIR)
assert tok.exact and tok.encode("hello world")
loaded = sorted({n.split(".")[0] for n, m in sys.modules.items() if m is not None} & {"torch", "sglang"})
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))  # ru_maxrss survives exec
print(",".join(loaded) + "|" + str(int(hwm.split()[1]) // 1024))
"""
ROUTER_PEAK_RSS_MIB = 300
"""Measured ~100 MiB with transformers' tokenizer (about 700 MiB if transformers imported torch)."""


def test_router_tokenizer_loads_transformers_without_torch():
    """What ``python -m sgl_moe.router`` does first (``keep_torch_out``), then a tokenizer built: transformers
    would import an installed torch; in the router's process it must not, and the process stays small."""
    import inspect

    from sgl_moe.router import __main__ as router_main

    assert "keep_torch_out()" in inspect.getsource(router_main.main)
    result = subprocess.run([sys.executable, "-c", ROUTER_PROCESS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded, peak_mib = result.stdout.strip().splitlines()[-1].split("|")
    assert not loaded, f"the router's tokenizer imported {loaded}"
    assert int(peak_mib) < ROUTER_PEAK_RSS_MIB
