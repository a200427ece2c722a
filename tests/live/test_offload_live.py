"""Real SGLang workers with ``--moe-expert-offload`` against the unpatched session worker.

Reference: the same SGLang, same weights, unpatched. Exact execution runs the router's experts from the offload
buffer with SGLang's own MoE kernel (expert ids remapped to buffer slots), so the tolerance is the streaming
patch's: same token ids, logprobs within 1e-5 (fp32 BLAS blocking follows buffer shapes and alignment; observed
differences are float32 ulps). Speculative execution changes decode outputs by design; its prompt logprobs and
first token come from the prefill forward, which always runs its true experts (whole layers streamed, or, under
16 tokens, the per-expert path), so they must still match.
"""

from __future__ import annotations

import concurrent.futures
import random

import httpx
import pytest

# Both offload workers (exact, with 4 resident experts per layer, and speculative; flags in conftest.py) start side
# by side once, and the offload benchmark in test_bench_scripts_live.py runs on the same exact worker.
pytestmark = pytest.mark.parametrize("worker_group", ["offload"], indirect=True)


@pytest.fixture
def exact_worker(worker_group):
    return worker_group["exact"]


def _generate(url, ids, new_tokens=6):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                  "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5}
    out = httpx.post(f"{url}/generate", json=body, timeout=300).json()
    meta = out["meta_info"]
    prompt = [t[0] for t in meta["input_token_logprobs"][1:]]
    decode = [t[0] for t in meta["output_token_logprobs"]] + [v for pos in meta["output_top_logprobs"]
                                                               for v, _, _ in pos]
    return out["output_ids"], prompt, decode


def _prompts(n, seed=3):
    rng = random.Random(seed)
    return [[rng.randrange(16, 4096) for _ in range(rng.choice((9, 40, 300)))] for _ in range(n)]


def _batch(url, prompts):
    """Concurrent requests, so decode forwards carry several tokens (a batch) as well as one."""
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: _generate(url, ids), prompts))


def _counts(worker):
    return httpx.get(f"{worker.url}/sgl_moe/info", timeout=10).json()["offload"]


def test_exact_offload_gives_the_unpatched_logprobs(worker, exact_worker):
    prompts = _prompts(4)
    got, ref = _batch(exact_worker.url, prompts), _batch(worker.url, prompts)
    worst = 0.0
    for (ids_o, prompt_o, dec_o), (ids_r, prompt_r, dec_r) in zip(got, ref):
        assert ids_o == ids_r
        assert len(dec_o) == len(dec_r)
        worst = max([worst] + [abs(a - b) for a, b in zip(prompt_o + dec_o, prompt_r + dec_r)])
    assert worst < 1e-5, worst


def test_exact_offload_counts_prefetch_hits_and_decode_forwards(exact_worker):
    import time

    _batch(exact_worker.url, _prompts(2, seed=11))
    time.sleep(1.2)  # the scheduler writes its counts at most once a second, at the end of a decode forward
    _batch(exact_worker.url, _prompts(1, seed=12))
    info = _counts(exact_worker)
    assert info["execution"] == "exact" and info["predictor"] == "hybrid"
    c = info["counts"]
    assert c["decode_forwards"] > 0 and c["stream_forwards"] > 0  # both paths ran
    assert c["hits"] > 0  # predictions were used...
    assert c["resident_hits"] > 0  # ...and the 4 resident experts per layer served tokens without a host copy
    assert c["bytes_moved"] > 0


def test_speculative_offload_keeps_prefill_exact_and_never_fetches_after_routing(worker, worker_group):
    proc = worker_group["speculative"]
    prompts = _prompts(3, seed=5)
    # A prompt shorter than E/k = 16 tokens, alone: its prefill takes the per-expert path, and must still
    # run its true experts (speculation is for decode steps only).
    short = [17, 250, 1033, 77, 9, 4000, 12, 512, 64]
    alone_s, alone_r = _generate(proc.url, short), _generate(worker.url, short)
    assert alone_s[0][0] == alone_r[0][0]
    assert max(abs(a - b) for a, b in zip(alone_s[1], alone_r[1])) < 1e-5
    got, ref = _batch(proc.url, prompts), _batch(worker.url, prompts)
    for (ids_s, prompt_s, _), (ids_r, prompt_r, _) in zip(got, ref):
        assert ids_s[0] == ids_r[0]  # the first token comes from the (exact) prefill
        assert max(abs(a - b) for a, b in zip(prompt_s, prompt_r)) < 1e-5
    import time

    time.sleep(1.2)
    _batch(proc.url, _prompts(1, seed=6))
    c = _counts(proc)["counts"]
    assert c["decode_forwards"] > 0
    # Layer 0 has no prediction and loads what it routes; every later layer runs exactly what was prefetched.
    assert c["misses_after_layer0"] == 0, c
