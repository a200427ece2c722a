"""The router in front of ONE real worker of each real-tokenizer test model (``sgl_moe.training.fixtures``):
predicted cached tokens, ``/v1/classify``, chat and request namespaces agree with the worker itself.

The workers are the session's ``fixture-models`` group (conftest.py), shared with test_fixture_models_live.py and
test_tokenizer_probe_live.py; the module fixture starts a router in front of the current kind's worker, pytest runs
that kind's tests, stops the router, then goes on to the next kind. Tolerance of classify vs SGLang's ``/v1/score``
as in test_classify_live.py (1e-5 absolute on probabilities).
"""

import math
import uuid

import httpx
import pytest

from sgl_moe.harness.router_client import generate, wait_until, workers
from sgl_moe.harness.router_process import RouterProcess, RouterStartError
from sgl_moe.training import fixtures

transformers = pytest.importorskip("transformers")

TOL = 1e-5
PAGE = 16
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}]
SAMPLING = {"max_new_tokens": 2, "temperature": 0}


pytestmark = pytest.mark.parametrize("worker_group", ["fixture-models"], indirect=True)


@pytest.fixture(scope="module", params=fixtures.KINDS)
def served(request, worker_group, tmp_path_factory):
    """(kind, AutoTokenizer, worker, router) for one fixture kind; the router is stopped before the next kind."""
    kind = request.param
    tok = transformers.AutoTokenizer.from_pretrained(request.getfixturevalue(f"{kind}_model_dir"))
    worker = worker_group[kind]
    router = RouterProcess(log_path=tmp_path_factory.mktemp(f"real-{kind}") / "router.log", worker_urls=[worker.url],
                           args=["--log-level", "debug"])
    try:
        router.start()
        router.wait_ready(timeout=60)
    except RouterStartError as exc:
        router.stop()
        pytest.fail(f"{kind}: {exc}")
    yield kind, tok, worker, router
    router.stop()


def unique_text(words: int) -> str:
    tag = uuid.uuid4().hex
    return f"# {tag}\n" + " ".join(f"value_{tag[i % 32]}{i}" for i in range(words)) + "\n"


def test_predicted_cached_tokens_equal_reported(served):
    kind, _, _, router = served
    text = unique_text(100)
    first = generate(router.url, text)
    assert first.status_code == 200, first.text
    assert first.headers["x-sgl-moe-predicted-cached-tokens"] == "0"
    wid = first.headers["x-sgl-moe-worker"]
    prompt_tokens = first.json()["meta_info"]["prompt_tokens"]
    assert prompt_tokens >= 200, prompt_tokens
    wait_until(lambda: workers(router.url)[wid]["committed_blocks"] >= prompt_tokens // PAGE
               and workers(router.url)[wid]["pending_blocks"] == 0, what="blocks committed")
    second = generate(router.url, text + "and a different tail")
    assert second.status_code == 200, second.text
    reported = second.json()["meta_info"]["cached_tokens"]
    predicted = int(second.headers["x-sgl-moe-predicted-cached-tokens"])
    print(f"{kind}: prompt {prompt_tokens} predicted {predicted} reported {reported}")
    assert reported >= prompt_tokens // PAGE * PAGE - PAGE
    assert predicted == reported, (kind, predicted, reported)


def test_classify_equals_sglang_score(served):
    kind, tok, worker, router = served
    tag = uuid.uuid4().hex
    prompt = f"# report {tag}\n" + " ".join(f"item_{tag[i % 32]}{i}" for i in range(60)) + "\nVerdict:"
    labels = [" x", " y", " z"]
    base = tok.encode(prompt)
    label_ids = []
    for label in labels:  # the label as text following the prompt
        full = tok.encode(prompt + label)
        assert full[:len(base)] == base and len(full) == len(base) + 1, (label, full[len(base):])
        label_ids.append(full[-1])
    resp = httpx.post(f"{router.url}/v1/classify", json={"prompt": prompt, "labels": labels}, timeout=120)
    assert resp.status_code == 200, resp.text
    [r] = resp.json()["results"]
    ref = httpx.post(f"{worker.url}/v1/score", json={"query": prompt, "items": [""], "label_token_ids": label_ids,
                                                     "apply_softmax": False}, timeout=120)
    assert ref.status_code == 200, ref.text
    ref = ref.json()["scores"][0]
    probs = [p / sum(ref) for p in ref]
    gap = max(max(abs(a - b) for a, b in zip(r["probs"], probs)),
              max(abs(a - math.log(b)) for a, b in zip(r["logprobs"], ref)))
    print(f"{kind}: max |classify - score| = {gap:.3g}")
    assert r["probs"] == pytest.approx(probs, abs=TOL)
    assert r["logprobs"] == pytest.approx([math.log(p) for p in ref], abs=TOL)
    assert r["prompt_tokens"] == len(base)


def test_chat_through_router_equals_direct(served):
    kind, _, worker, router = served
    variants = [{}] if kind == "llama" else [{}, {"chat_template_kwargs": {"enable_thinking": False}}]
    for extra in variants:
        body = {"messages": CHAT, "max_tokens": 4, "temperature": 0, **extra}
        via, direct = (httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
                       for url in (router.url, worker.url))
        assert via.status_code == direct.status_code == 200, (via.text, direct.text)
        got, want = via.json(), direct.json()
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"], extra
        assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"], extra
        print(f"{kind} {extra}: {got['usage']['prompt_tokens']} prompt tokens,"
              f" {got['choices'][0]['message']['content']!r}")


@pytest.mark.parametrize("field,value", [("lora_path", "adapter-a"), ("extra_key", "tenant-7"),
                                         ("cache_salt", "salt-1")])
def test_namespaced_requests_answer_without_5xx(served, field, value):
    _, _, worker, router = served
    body = {"text": unique_text(30), field: value, "sampling_params": SAMPLING}
    direct = httpx.post(f"{worker.url}/generate", json=body, timeout=120)
    via = httpx.post(f"{router.url}/generate", json=body, timeout=120)
    assert via.status_code < 500, via.text
    if field == "lora_path":
        assert direct.status_code in (200, 400), direct.text
        assert via.status_code == direct.status_code, (via.text, direct.text)
    else:
        assert direct.status_code == via.status_code == 200, (via.text, direct.text)
