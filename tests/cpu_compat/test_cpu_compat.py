"""The CPU compatibility layer: active without CUDA, inert where the real sgl_kernel imports."""

import os
import subprocess
import sys
import textwrap

import pytest

from sgl_moe import cpu_compat


def test_decide_with_cuda_changes_nothing():
    plan = cpu_compat.decide(cuda_usable=True, kernel_import_error=None)
    assert not plan.active and not plan.stand_in_kernel and plan.required_server_args == {}


def test_decide_without_cuda_and_broken_kernel_uses_stand_in():
    plan = cpu_compat.decide(cuda_usable=False, kernel_import_error="ImportError: libcuda.so.1")
    assert plan.cpu_engine and plan.stand_in_kernel
    assert plan.required_server_args == {"device": "cpu", "attention_backend": "torch_native",
                                         "disable_cuda_graph": True}


def test_decide_without_cuda_but_working_kernel_never_shadows_it():
    plan = cpu_compat.decide(cuda_usable=False, kernel_import_error=None)
    assert plan.cpu_engine and not plan.stand_in_kernel


def test_apply_reaches_child_processes_through_the_environment():
    env = {"PYTHONPATH": "/somewhere"}
    cpu_compat.decide(False, "ImportError").apply(env)
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(cpu_compat.STUB_DIR), "/somewhere"]
    code = "import sgl_kernel, os; print(sgl_kernel.SGL_MOE_STAND_IN, os.environ['SGLANG_USE_CPU_ENGINE'])"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "1"], out.stderr


def test_probe_on_this_machine():
    """Real probe: on a machine without a GPU the layer is active; with one, it is not."""
    plan = cpu_compat.probe()
    if cpu_compat.cuda_usable():
        assert not plan.active
    else:
        assert plan.cpu_engine
        if plan.stand_in_kernel:
            assert "sgl_kernel" in plan.reason


def test_probe_sees_a_real_kernel_library_when_one_imports(tmp_path, monkeypatch):
    """Simulated GPU-side install: an importable sgl_kernel that is not the stand-in is left alone."""
    fake = tmp_path / "sgl_kernel"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("sgl_kernel")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        assert cpu_compat.real_kernel_import_error() is None
        monkeypatch.setattr(cpu_compat, "cuda_usable", lambda: False)
        plan = cpu_compat.probe()
        assert plan.cpu_engine and not plan.stand_in_kernel
    finally:
        # The fake must not outlive the test: a later probe in this process would take it for the real
        # library (monkeypatch restores the entries it deleted, not the ones the import added).
        for name in [m for m in sys.modules if m.startswith("sgl_kernel")]:
            del sys.modules[name]


def test_stand_in_names_the_missing_kernel():
    code = textwrap.dedent("""
        import sgl_kernel
        from sgl_kernel.flash_attn import flash_attn_varlen_func
        from sgl_kernel import scalar_types
        assert repr(scalar_types.uint4b8).startswith('<missing sgl_kernel kernel')
        for fn in (sgl_kernel.rmsnorm, flash_attn_varlen_func):
            try:
                fn(1, 2)
            except sgl_kernel.MissingKernelError as e:
                print(e)
    """)
    env = {**os.environ, "PYTHONPATH": str(cpu_compat.STUB_DIR)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "'rmsnorm'" in lines[0] and "'flash_attn.flash_attn_varlen_func'" in lines[1]


def test_stand_in_dunder_lookups_fail_like_a_normal_module():
    env = {**os.environ, "PYTHONPATH": str(cpu_compat.STUB_DIR)}
    code = "import sgl_kernel, copy; assert not hasattr(sgl_kernel, '__wrapped__'); copy.copy(sgl_kernel.x)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("error", ["ImportError: libcuda.so.1: cannot open shared object file"])
def test_reason_is_one_line(error):
    assert "\n" not in cpu_compat.decide(False, error).reason
