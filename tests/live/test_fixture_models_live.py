"""A real SGLang worker serves each test model that looks like a real checkpoint (sgl_moe.training.fixtures), and
tokenizes as transformers' AutoTokenizer does: ``/v1/tokenize``, the prompt ids ``/generate`` actually ran, and the
chat template behind ``/v1/chat/completions``. Straight to the worker, not through the router. The workers are the
session's ``fixture-models`` group (conftest.py), shared with test_real_models_live.py and
test_tokenizer_probe_live.py."""

import httpx
import pytest

from sgl_moe.training import fixtures

transformers = pytest.importorskip("transformers")

PROBES = [
    "hello world",
    "héllo wörld — naïve café, 日本語 🙂",
    "a    b\t\tc\n\n  d",
    'def f(x):\n    return {"k": [1, 2]}  # ok\n',
    "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n<s>[INST] x [/INST]</s>",
]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]


pytestmark = pytest.mark.parametrize("worker_group", ["fixture-models"], indirect=True)


@pytest.fixture(scope="module", params=fixtures.KINDS)
def served(request, worker_group):
    """(kind, AutoTokenizer, worker) for one fixture kind; pytest runs one kind's tests, then the next."""
    kind = request.param
    tok = transformers.AutoTokenizer.from_pretrained(request.getfixturevalue(f"{kind}_model_dir"))
    with httpx.Client(base_url=worker_group[kind].url, timeout=120) as client:
        yield kind, tok, client


def _chat_ids(tok, **kwargs) -> list[int]:
    return list(tok.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs))


def test_tokenize_route_agrees_with_autotokenizer(served):
    _, tok, client = served
    for text in PROBES:
        for add_special in (True, False):
            r = client.post("/v1/tokenize", json={"prompt": text, "add_special_tokens": add_special})
            assert r.status_code == 200, r.text
            assert r.json()["tokens"] == tok.encode(text, add_special_tokens=add_special), (text, add_special)
        ids = tok.encode(text)
        r = client.post("/v1/detokenize", json={"tokens": ids})
        assert r.status_code == 200, r.text
        assert r.json()["text"] == tok.decode(ids, skip_special_tokens=True), text


def test_generate_runs_the_prompt_ids_autotokenizer_gives(served):
    """The ids /generate prefilled are AutoTokenizer's, BOS included for llama.

    Read from ``return_prompt_token_ids``, not from the prompt logprobs: SGLang 0.5.23 reports the id
    ``vocab_size - 1`` as 0 there (it clips ids ``>= vocab_size - 1``, meant for padded image hashes)."""
    kind, tok, client = served
    for text in PROBES:
        r = client.post("/generate", json={
            "text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_prompt_token_ids": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["prompt_token_ids"] == tok.encode(text), text
        assert body["meta_info"]["prompt_tokens"] == len(body["prompt_token_ids"])
        assert (body["prompt_token_ids"][0] == tok.bos_token_id) == (kind == "llama")


def test_chat_template_renders_through_chat_completions(served):
    """The worker renders the fixture's own template (tokenize with messages = AutoTokenizer's chat ids) and a chat
    completion on it answers 200 with that many prompt tokens."""
    kind, tok, client = served
    variants = [None] if kind == "llama" else [None, True, False]
    rendered = {}
    for thinking in variants:
        kwargs = {} if thinking is None else {"enable_thinking": thinking}
        expected = _chat_ids(tok, **kwargs)
        extra = {"chat_template_kwargs": kwargs} if kwargs else {}
        r = client.post("/v1/tokenize", json={"messages": CHAT, **extra})
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == expected, kwargs
        r = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1, "temperature": 0,
                                                      "return_input_ids_in_sglext": True, **extra})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["sglext"]["input_ids"] == expected, kwargs
        assert body["usage"]["prompt_tokens"] == len(expected), kwargs
        assert body["choices"][0]["finish_reason"] in ("length", "stop")
        rendered[thinking] = tok.decode(expected)
    if kind == "llama":  # the template's own BOS, and no second one from encoding
        assert rendered[None] == "<s>[INST] Be brief.\n\nName a prime. [/INST]"
        assert _chat_ids(tok).count(tok.bos_token_id) == 1
    else:
        assert rendered[None] == rendered[True]
        assert rendered[False] == rendered[None] + "<think>\n\n</think>\n\n"
