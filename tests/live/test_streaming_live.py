"""A real SGLang worker with ``--moe-weight-streaming host`` against the unpatched session worker.

Reference: the same SGLang, same weights, unpatched. Tolerance: same token ids, logprobs within 1e-5. The patch
only changes where the experts' bytes live (a host store copied into a slot buffer); SGLang's own MoE kernel
reads the same bytes. It is not bit-exact because the fp32 BLAS kernels choose their blocking (and so their
summation order) from buffer alignment and shapes, and the two workers' KV pools differ in size: observed
differences are ~2e-7 (one or two float32 ulps of a logprob near -2), far below 1e-5, and most runs are exact.
"""

from __future__ import annotations

import random

import httpx
import pytest

from sgl_moe.flops import FlopsModel
from sgl_moe.harness.router_process import RouterProcess

# The worker (``--moe-weight-streaming host --moe-stream-window 2``, conftest.py) starts side by side with
# test_streaming_mixtral_live.py's: the ``weight-streaming`` group.
pytestmark = pytest.mark.parametrize("worker_group", ["weight-streaming"], indirect=True)


@pytest.fixture
def streaming_worker(worker_group):
    return worker_group["shipped"]


def _calibrated_info(worker, timeout=120.0):
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        info = httpx.get(f"{worker.url}/sgl_moe/info", timeout=10).json()
        if info["saturation"]["state"] != "calibrating":
            return info
        time.sleep(0.5)
    raise AssertionError("the streaming worker did not finish calibrating Θ")


def _logprobs(url, ids):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}, "return_logprob": True,
            "logprob_start_len": 0, "top_logprobs_num": 5}
    out = httpx.post(f"{url}/generate", json=body, timeout=300).json()
    meta = out["meta_info"]
    top = [[(t[1], t[0]) for t in pos] for pos in meta["output_top_logprobs"]]
    values = [t[0] for t in meta["input_token_logprobs"][1:]] + [t[0] for t in meta["output_token_logprobs"]]
    values += [v for pos in top for _, v in pos]
    return out["output_ids"], [[tok for tok, _ in pos] for pos in top], values


def test_streamed_experts_give_the_unpatched_logprobs(worker, streaming_worker):
    rng = random.Random(7)
    worst = 0.0
    for n in (17, 300, 2000):  # one page, several, and a long prompt
        ids = [rng.randrange(16, 4096) for _ in range(n)]
        out_s, top_s, vals_s = _logprobs(streaming_worker.url, ids)
        out_r, top_r, vals_r = _logprobs(worker.url, ids)
        assert out_s == out_r and top_s == top_r
        assert len(vals_s) == len(vals_r) == n - 1 + 4 + 4 * 5
        worst = max(worst, max(abs(a - b) for a, b in zip(vals_s, vals_r)))
    assert worst <= 1e-5, worst


def test_streaming_worker_reports_a_calibrated_theta(streaming_worker):
    info = _calibrated_info(streaming_worker)
    sat = info["saturation"]
    assert sat["state"] == "calibrated", sat["source"]
    assert info["moe_args"]["weight_streaming"] == "host"
    # Eq. 3: Θ = margin x max(1, t_max / t0) x F_ref, F_ref = FLOPs of the profiled forward.
    assert sat["ratio"] >= 1.0 and sat["t_max_s"] >= sat["t0_s"] > 0
    assert sat["flops"] == pytest.approx(sat["margin"] * sat["ratio"] * sat["f_ref"])
    flops = FlopsModel.from_dict(info["flops"])
    assert sat["f_ref"] == pytest.approx(flops.request_flops(0, sat["profile_tokens"]))
    assert sat["profile_tokens"] >= min(sat["step_tokens"], info["context_length"] - 8)


def test_router_uses_the_calibrated_theta(streaming_worker, tmp_path):
    info = _calibrated_info(streaming_worker)
    router = RouterProcess(log_path=tmp_path / "router.log", worker_urls=[streaming_worker.url]).start()
    try:
        router.wait_ready(timeout=120)
        [w] = httpx.get(f"{router.url}/workers", timeout=10).json()["workers"]
        assert w["theta_flops"] == pytest.approx(info["saturation"]["flops"])
        assert "calibrated" in w["theta_source"]
    finally:
        router.stop()
