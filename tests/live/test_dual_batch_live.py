"""Real SGLang workers with ``--moe-dual-batch cpu-experts`` and ``streams`` against the unpatched session worker.

Reference: the same SGLang, same weights, unpatched. The patched worker runs each decode forward of several
sequences as two micro-batches (SGLang's own norm, attention and gate modules on each micro-batch's rows, the
experts on a CPU worker thread; ``streams`` on a CPU: attention and experts each on a worker thread, the
emulation of two CUDA streams). Tolerance: same token ids, logprobs within 1e-5. Not bit-exact, because the
micro-batches' GEMMs have other row counts than the whole batch's (fp32 BLAS picks other blockings), and the
experts run through ``moe_math.experts_forward`` instead of SGLang's native MoE loop (other summation order);
observed differences are ~3e-6. ``--moe-dual-batch-always`` makes every eligible forward split, so the test
exercises the overlap path whether or not the solver would predict a gain on this tiny model.
"""

from __future__ import annotations

import concurrent.futures
import random

import httpx
import pytest

# One patched worker per placement, both started side by side (the ``dual-batch`` group in conftest.py).
pytestmark = pytest.mark.parametrize("worker_group", ["dual-batch"], indirect=True)


@pytest.fixture(params=["cpu-experts", "streams"])
def dual_worker(request, worker_group):
    return worker_group[request.param]


def _generate(url, ids):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 3}
    meta_out = httpx.post(f"{url}/generate", json=body, timeout=300).json()
    meta = meta_out["meta_info"]
    return meta_out["output_ids"], [t[0] for t in meta["output_token_logprobs"]]


def _batch(url, prompts):
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: _generate(url, ids), prompts))


def test_dual_micro_batch_decode_gives_the_unpatched_tokens(worker, dual_worker):
    rng = random.Random(21)
    # Two rounds: the first forwards calibrate the cost model (SGLang's path), later ones are split.
    for _ in range(2):
        prompts = [[rng.randrange(16, 4096) for _ in range(rng.choice((20, 90, 250)))] for _ in range(4)]
        got, ref = _batch(dual_worker.url, prompts), _batch(worker.url, prompts)
        for (ids_d, lp_d), (ids_r, lp_r) in zip(got, ref):
            assert ids_d == ids_r
            assert max(abs(a - b) for a, b in zip(lp_d, lp_r)) < 1e-5
    log = dual_worker.log_path.read_text(errors="replace")
    assert "cost model from" in log
    assert ": overlap; split" in log  # at least one decode forward ran as two micro-batches
    info = httpx.get(f"{dual_worker.url}/sgl_moe/info", timeout=30).json()["dual_batch"]
    counts = info["counts"]  # written by the scheduler's patch on its first overlapped forward
    assert counts["placement"] == info["placement"] and counts["overlapped"] >= 1
    assert counts["failed"] == 0 and not counts["disabled"] and "overlap failed" not in log
    assert counts["calibration"] == 6 and counts["cost_model"] is not None and 0.0 <= counts["eta"] <= 1.0
