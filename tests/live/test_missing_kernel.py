"""A worker whose forward pass needs a kernel the CPU stand-in lacks fails fast, naming the kernel.

SGLang's non-AMX CPU path never calls sgl_kernel, so the call is injected: a ``sitecustomize`` on the
workers' PYTHONPATH makes Qwen3-MoE's MoE block call ``sgl_kernel.moe_fused_gate`` first, in SGLang's
child processes only (the launcher sets SGLANG_USE_CPU_ENGINE for them). The worker must then exit
(SGLang's scheduler reports the error and takes the server down) instead of hanging.
"""

import textwrap

import pytest

from sgl_moe import cpu_compat
from sgl_moe.harness.worker_process import WorkerProcess, WorkerStartError

SITECUSTOMIZE = textwrap.dedent('''
    import importlib.abc, importlib.util, os, sys
    TARGET = "sglang.srt.models.qwen3_moe"

    class _Inject(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != TARGET:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                forward = module.Qwen3MoeSparseMoeBlock.forward

                def needs_kernel(self, hidden_states, *args, **kwargs):
                    import sgl_kernel
                    sgl_kernel.moe_fused_gate(hidden_states)
                    return forward(self, hidden_states, *args, **kwargs)

                module.Qwen3MoeSparseMoeBlock.forward = needs_kernel

            spec.loader.exec_module = exec_module
            return spec

    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        sys.meta_path.insert(0, _Inject())
''')


def test_missing_kernel_fails_the_worker_with_its_name(tmp_path):
    if cpu_compat.cuda_usable():
        pytest.skip("the stand-in is only used without a CUDA device")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    worker = WorkerProcess(log_path=tmp_path / "worker.log", env={"PYTHONPATH": str(site)}).start()
    try:
        with pytest.raises(WorkerStartError) as info:
            worker.wait_ready(timeout=400)
    finally:
        worker.stop()
    assert "exited with status" in str(info.value), "the worker hung instead of failing"
    log = worker.log_path.read_text(errors="replace")
    assert "MissingKernelError" in log and "sgl_kernel kernel 'moe_fused_gate' was called" in log
