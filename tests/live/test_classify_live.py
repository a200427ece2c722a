"""``POST /v1/classify`` through the router in front of real SGLang workers, checked against SGLang's own
``/v1/score`` on a worker.

Tolerance: 1e-5 absolute on probabilities. The router and the reference call run the same fp32 model on
the same token ids, but SGLang may batch them with different neighbours (other shapes, another worker),
which changes summation order; that moves probabilities by ~1e-7. A wrong token, position or label
chain moves them by far more than 1e-3.
"""

import math
import uuid

import httpx
import pytest

from sgl_moe.router.front.prefill_tasks import choice_prompt, multi_suffix
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

TOL = 1e-5


@pytest.fixture(scope="module")
def tok(cluster):
    w = cluster[0]
    return RouterTokenizer.from_files(httpx.get(f"{w.url}/sgl_moe/tokenizer.json", timeout=30).content,
                                      httpx.get(f"{w.url}/sgl_moe/tokenizer_config.json", timeout=30).json())


@pytest.fixture(scope="module")
def router(cluster, tmp_path_factory):
    from sgl_moe.harness.router_process import RouterProcess
    r = RouterProcess(log_path=tmp_path_factory.mktemp("classify") / "router.log",
                      worker_urls=[w.url for w in cluster], args=["--log-level", "debug"])
    r.start()
    r.wait_ready(timeout=60)
    yield r
    r.stop()


def doc() -> str:
    tag = uuid.uuid4().hex
    return f"# report {tag}\n" + " ".join(f"item_{tag[i % 32]}{i}" for i in range(70)) + "\nVerdict:"


def classify(router, body, status=200):
    resp = httpx.post(f"{router.url}/v1/classify", json=body, timeout=120)
    assert resp.status_code == status, resp.text
    return resp.json()


def direct_score(worker, query, label_ids, item=None):
    """SGLang's own /v1/score on one worker: full-vocabulary probabilities of ``label_ids`` after query+item."""
    body = {"query": query, "items": [item if item is not None else ([] if isinstance(query, list) else "")],
            "label_token_ids": label_ids, "apply_softmax": False}
    resp = httpx.post(f"{worker.url}/v1/score", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["scores"][0]


def test_single_token_labels_equal_sglang_score(router, cluster, tok):
    prompt = doc()
    labels = [" x", " y", " z"]
    assert all(len(tok.encode_plain(label)) == 1 for label in labels)
    out = classify(router, {"prompt": prompt, "labels": labels, "id": "q1"})
    [r] = out["results"]
    ref = direct_score(cluster[0], prompt, [tok.encode_plain(label)[0] for label in labels])
    assert r["probs"] == pytest.approx([p / sum(ref) for p in ref], abs=TOL)
    assert r["logprobs"] == pytest.approx([math.log(p) for p in ref], abs=TOL)
    assert r["label"] == labels[max(range(3), key=ref.__getitem__)] and r["id"] == "q1"
    assert out["usage"]["score_requests"] == 1 and r["prompt_tokens"] == len(tok.encode(prompt))


def test_multi_token_labels_score_the_whole_label(router, cluster, tok):
    prompt = doc()
    labels = [" positive_result", " negative"]
    ids = [tok.encode_plain(label) for label in labels]
    assert max(len(i) for i in ids) > 1, ids
    r = classify(router, {"prompt": prompt, "labels": labels})["results"][0]
    q = tok.encode(prompt)
    ref_lp = []
    for chain in ids:  # the chain rule, one SGLang /v1/score call per label token
        lp = 0.0
        for k, t in enumerate(chain):
            lp += math.log(direct_score(cluster[1], q, [t], item=chain[:k])[0])
        ref_lp.append(lp)
    assert r["logprobs"] == pytest.approx(ref_lp, abs=1e-4)
    z = sum(math.exp(x) for x in ref_lp)
    assert r["probs"] == pytest.approx([math.exp(x) / z for x in ref_lp], abs=TOL)
    first = classify(router, {"prompt": prompt, "labels": labels, "label_scoring": "first_token"})["results"][0]
    ref_first = direct_score(cluster[0], prompt, [i[0] for i in ids])
    assert first["logprobs"] == pytest.approx([math.log(p) for p in ref_first], abs=TOL)


def test_single_choice_scores_the_identifiers(router, cluster, tok):
    prompt, choices = doc(), ["lists", "dicts", "sets", "tuples"]
    r = classify(router, {"type": "choice", "prompt": prompt, "choices": choices})["results"][0]
    ref = direct_score(cluster[0], choice_prompt(prompt, choices, list("ABCD")),
                       [tok.encode_plain(f" {c}")[0] for c in "ABCD"])
    assert r["probs"] == pytest.approx([p / sum(ref) for p in ref], abs=TOL)
    assert r["answer"] == "ABCD"[max(range(4), key=ref.__getitem__)] and r["choices"] == choices


def test_multi_selection_siblings_share_the_prompt_and_co_locate(router, cluster, tok):
    prompt, choices = doc(), ["alpha", "beta", "gamma", "delta", "epsilon"]
    r = classify(router, {"type": "multi", "prompt": prompt, "choices": choices, "threshold": 0.3})["results"][0]
    assert len(r["workers"]) == 5 and len(set(r["workers"])) == 1, r["workers"]
    yes, no = tok.encode_plain(" yes"), tok.encode_plain(" no")
    for c, p in zip(choices, r["probs"]):
        if len(yes) == 1 and len(no) == 1:
            ref = direct_score(cluster[1], prompt + multi_suffix(c), [yes[0], no[0]])
            assert p == pytest.approx(ref[0] / sum(ref), abs=TOL)
    assert r["selected"] == [i for i, p in enumerate(r["probs"]) if p >= 0.3]


def test_batch_keeps_order_and_ids(router):
    tasks = [{"id": n, "prompt": doc(), "labels": [" x", " y"]} for n in range(6)]
    tasks.insert(3, {"id": "c", "type": "choice", "prompt": doc(), "choices": ["u", "v"]})
    out = classify(router, {"inputs": tasks})
    assert [r["id"] for r in out["results"]] == [t["id"] for t in tasks]
    assert all("error" not in r and abs(sum(r["probs"]) - 1) < 1e-6 for r in out["results"])
    assert out["usage"]["score_requests"] == 7


def _requests_sent(router):
    return sum(w["counters"]["requests"] for w in httpx.get(f"{router.url}/workers", timeout=10).json()["workers"])


def test_invalid_input_is_refused_before_any_work(router):
    classify(router, {"prompt": doc(), "labels": [" x", " y"]})
    sent = _requests_sent(router)
    assert sent > 0
    tasks = [{"prompt": doc(), "labels": [" x", " y"]}, {"prompt": doc(), "labels": [" x"]}]
    err = classify(router, {"inputs": tasks}, status=400)["error"]
    assert err["param"] == "inputs[1].labels"
    too_long = {"prompt": "word " * 5000, "labels": [" x", " y"]}
    err = classify(router, {"inputs": [tasks[0], too_long]}, status=400)["error"]
    assert err["param"] == "inputs[1]" and "context" in err["message"], err
    assert classify(router, {"messages": [{"role": "user", "content": "hi"}], "labels": [" x", " y"]},
                    status=400)["error"]["param"] == "messages"  # the shipped model has no chat template
    classify(router, {"prompt": "p", "labels": [" x", " y"], "model": "other"}, status=404)
    resp = httpx.post(f"{router.url}/v1/classify", content=b"{nope", timeout=10)
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    assert _requests_sent(router) == sent  # the valid first task of each refused batch was not sent either
