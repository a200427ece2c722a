"""parse_request: 4xx for bad input, the token ids SGLang prefills, field-set parity with SGLang."""

import dataclasses
import json
from pathlib import Path

import pytest

import sgl_moe
from sgl_moe.router.errors import RequestError
from sgl_moe.router.request.api_fields import (
    CHAT_FIELDS,
    CHAT_VALIDATOR_INPUTS,
    COMPLETION_FIELDS,
    DECISION_FIELDS,
    GENERATE_FIELDS,
    SCORE_FIELDS,
)
from sgl_moe.router.request.context_limits import DEFAULT_COMPLETION_MAX_TOKENS, DEFAULT_MAX_NEW_TOKENS
from sgl_moe.router.request.parsed_request import Namespace
from sgl_moe.router.request.request_parsing import parse_request
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

MODEL_DIR = Path(sgl_moe.__file__).parent / "models" / "tiny-qwen3-moe"
SERVED = "tiny"
CONTEXT = 4096
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _config(**overrides):
    config = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def tok():
    return RouterTokenizer.from_files((MODEL_DIR / "tokenizer.json").read_bytes(), _config())


@pytest.fixture(scope="module")
def chat_tok():
    return RouterTokenizer.from_files((MODEL_DIR / "tokenizer.json").read_bytes(), _config(chat_template=CHAT_TEMPLATE))


@pytest.fixture(scope="module")
def sglang_tok():
    """The tokenizer SGLang loads (AutoTokenizer plus SGLang's post-load fixes)."""
    hf = pytest.importorskip("sglang.srt.utils.hf_transformers.tokenizer")
    return hf.get_tokenizer(str(MODEL_DIR), tokenizer_mode="auto")


@pytest.fixture(scope="module")
def sglang_chat_tok(tmp_path_factory):
    hf = pytest.importorskip("sglang.srt.utils.hf_transformers.tokenizer")
    path = tmp_path_factory.mktemp("chat_tok")
    (path / "tokenizer.json").write_bytes((MODEL_DIR / "tokenizer.json").read_bytes())
    (path / "tokenizer_config.json").write_text(json.dumps(_config(chat_template=CHAT_TEMPLATE)))
    return hf.get_tokenizer(str(path), tokenizer_mode="auto")


def parse(endpoint, body, tokenizer, context_length=CONTEXT):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(endpoint, raw, tokenizer=tokenizer, served_model_name=SERVED,
                         context_length=context_length)


def rejects(endpoint, body, tokenizer, status=400, match=None, context_length=CONTEXT):
    with pytest.raises(RequestError) as info:
        parse(endpoint, body, tokenizer, context_length)
    assert info.value.status == status, info.value.message
    if match is not None:
        assert match in info.value.message, info.value.message
    return info.value


# --- 4xx --------------------------------------------------------------------------------------

ALL = ["/generate", "/v1/completions", "/v1/chat/completions", "/v1/score", "/v1/decisions"]


@pytest.mark.parametrize("endpoint", ALL)
def test_invalid_json_and_non_objects(tok, endpoint):
    rejects(endpoint, b"{not json", tok, match="not valid JSON")
    rejects(endpoint, b"[1, 2]", tok, match="JSON object")
    rejects(endpoint, b'"text"', tok, match="JSON object")


@pytest.mark.parametrize("endpoint", ALL)
def test_unknown_field_is_named(tok, endpoint):
    error = rejects(endpoint, {"max_token": 5}, tok, match="'max_token'")
    assert error.param == "max_token"


def test_unknown_endpoint(tok):
    rejects("/v1/embeddings", {}, tok, status=404)


@pytest.mark.parametrize("endpoint,body", [
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("/v1/score", {"query": "x", "items": ["y"], "label_token_ids": [5]}),
    ("/v1/decisions", {"input": "x", "questions": [{"id": "q", "type": "yes_no", "question": "y?"}]}),
])
def test_model_name(tok, chat_tok, endpoint, body):
    if endpoint == "/v1/chat/completions":
        tok = chat_tok  # without a template the chat route answers 400 (see test_chat_without_template_is_a_400)
    error = rejects(endpoint, {**body, "model": "other"}, tok, status=404, match="The model 'other' does not exist")
    assert error.param == "model"
    rejects(endpoint, {**body, "model": "other:adapter"}, tok, status=404)
    assert parse(endpoint, {**body, "model": SERVED}, tok).model == SERVED
    assert parse(endpoint, body, tok).model is None


@pytest.mark.parametrize("endpoint,body", [
    ("/generate", {"text": ""}),
    ("/generate", {"text": []}),
    ("/generate", {"text": ["a", ""]}),
    ("/generate", {"input_ids": []}),
    ("/generate", {"input_ids": [[1, 2], []]}),
    ("/generate", {}),
    ("/v1/completions", {"prompt": ""}),
    ("/v1/completions", {"prompt": []}),
    ("/v1/completions", {"prompt": ["a", ""]}),
    ("/v1/completions", {"prompt": [[]]}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "input_ids": []}),
    ("/v1/score", {"query": "x", "items": [], "label_token_ids": [5]}),
    ("/v1/score", {"query": "x", "label_token_ids": [5]}),
    ("/v1/score", {"query": "", "items": [""], "label_token_ids": [5]}),
    ("/v1/score", {"query": [], "items": [[]], "label_token_ids": [5]}),
    ("/v1/decisions", {"input": " ", "questions": [{"id": "q", "type": "yes_no", "question": "y?"}]}),
    ("/v1/decisions", {"input": "x", "questions": []}),
])
def test_empty_prompts(tok, endpoint, body):
    rejects(endpoint, body, tok)


@pytest.mark.parametrize("endpoint,body,param", [
    ("/generate", {"text": 5}, "text"),
    ("/generate", {"input_ids": [1, -2]}, "input_ids"),
    ("/generate", {"input_ids": [1, "2"]}, "input_ids"),
    ("/generate", {"input_ids": [True]}, "input_ids"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, "sampling_params"),
    ("/generate", {"text": "x", "sampling_params": [{}, {}]}, "sampling_params"),
    ("/generate", {"text": "x", "stream": "yes"}, "stream"),
    ("/generate", {"text": "x", "cache_salt": ["a"]}, "cache_salt"),
    ("/generate", {"text": ["x", "y"], "extra_key": ["a"]}, "extra_key"),
    ("/generate", {"input_embeds": [[]]}, "input_embeds"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "model": 3}, "model"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "max_tokens"),
    ("/v1/score", {"query": "x", "items": [[5, 6]], "label_token_ids": [5]}, "query"),
    ("/v1/score", {"query": [5], "items": ["y"], "label_token_ids": [5]}, "query"),
    ("/v1/score", {"items": ["y", [5]], "label_token_ids": [5]}, "items"),
    ("/v1/decisions", {"input": "x", "questions": [{"id": "q", "type": "rank", "question": "y?"}]}, "questions[0]"),
    ("/v1/decisions", {"input": "x", "model": f"{SERVED}:ad",
                       "questions": [{"id": "q", "type": "yes_no", "question": "y?"}]}, "model"),
])
def test_bad_values(tok, endpoint, body, param):
    assert rejects(endpoint, body, tok).param == param


def test_context_length_rule(tok):
    ids = list(range(10, 20))  # 10 tokens
    # The scheduler refuses prompts of context_length - 6 tokens or more (max_req_input_len) ...
    rejects("/generate", {"input_ids": ids}, tok, context_length=16, match="The input (10 tokens) is too long: with "
                                                                           "a context length of 16 tokens")
    p = parse("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": None}}, tok, context_length=17)
    assert p.max_new_tokens == 5  # Scheduler.init_req_max_new_tokens: context - 1 - len - 1
    # ... and the tokenizer manager prompt + an explicitly requested max_new_tokens above the context;
    # the implicit default (128) is not counted.
    error = rejects("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 8}}, tok,
                    context_length=17)
    assert "of 17 tokens" in error.message and "a total of 18 tokens: 10 tokens" in error.message
    assert parse("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 7}}, tok,
                 context_length=17).max_new_tokens == 5
    assert parse("/generate", {"input_ids": ids}, tok, context_length=17).max_new_tokens == 5
    # /v1/completions always sends max_tokens (default 16).
    rejects("/v1/completions", {"prompt": ids}, tok, context_length=20, match="a total of 26 tokens")
    rejects("/v1/score", {"query": ids[:5], "items": [ids[5:]], "label_token_ids": [5]}, tok, context_length=16)
    assert parse("/v1/score", {"query": ids[:5], "items": [ids[5:]], "label_token_ids": [5]}, tok,
                 context_length=17).prompts == [ids]
    rejects("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "input_ids": ids,
                                     "max_completion_tokens": 8}, tok, context_length=17)


# --- token ids ---------------------------------------------------------------------------------

TEXTS = ["def foo(x):\n    return x", "import os, sys\n", "héllo ✓ <s> wörld", "  \tindent"]


def test_generate_text_is_forwarded_as_sglang_token_ids(tok, sglang_tok):
    for text in TEXTS:
        p = parse("/generate", {"text": text, "sampling_params": {"temperature": 0}}, tok)
        expected = sglang_tok(text)["input_ids"]
        assert p.prompts == [expected] and p.affinity
        assert p.body == {"input_ids": expected, "sampling_params": {"temperature": 0}}
        assert p.shared_prefix_len == len(expected)
        assert p.max_new_tokens == DEFAULT_MAX_NEW_TOKENS and not p.prefill_only and not p.stream


def test_generate_batch(tok, sglang_tok):
    p = parse("/generate", {"text": TEXTS[:2] + ["def foo(y)"], "stream": True}, tok)
    assert p.prompts == sglang_tok(TEXTS[:2] + ["def foo(y)"])["input_ids"]
    assert p.body["input_ids"] == p.prompts and "text" not in p.body
    assert p.shared_prefix_len == 0 and p.stream
    p = parse("/generate", {"text": ["def foo(x)", "def foo(y)"]}, tok)
    assert p.shared_prefix_len == len(tok.encode("def foo("))


def test_generate_input_ids_are_used_directly(tok):
    body = {"input_ids": [[5, 6, 7], [5, 6, 8]], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 0}]}
    p = parse("/generate", body, tok)
    assert p.prompts == body["input_ids"] and p.body == body
    assert p.shared_prefix_len == 2 and p.prefill_only and p.max_new_tokens == 1
    # SGLang tokenizes nothing when input_ids come with text: the ids win.
    p = parse("/generate", {"text": "abc", "input_ids": [9, 9]}, tok)
    assert p.prompts == [[9, 9]] and p.body["text"] == "abc"


def test_generate_unbounded_max_new_tokens(tok):
    p = parse("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": None}}, tok,
              context_length=100)
    assert p.max_new_tokens == 95 and not p.prefill_only


def test_generate_without_exact_ids(tok):
    p = parse("/generate", {"text": "x", "image_data": "http://x/img.png"}, tok)
    assert not p.affinity and p.body["text"] == "x"
    p = parse("/generate", {"input_embeds": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]}, tok)
    assert not p.affinity and p.prompts == [[0, 0, 0]]
    inexact = RouterTokenizer.from_files((MODEL_DIR / "tokenizer.json").read_bytes(), _config())
    inexact.mark_inexact("the worker's ids disagreed")  # what the pool does when its check fails
    p = parse("/generate", {"text": "x"}, inexact)
    assert not p.affinity and p.body == {"text": "x"}


def test_completions(tok, sglang_tok):
    p = parse("/v1/completions", {"prompt": TEXTS[0], "max_tokens": 1}, tok)
    assert p.prompts == [sglang_tok(TEXTS[0])["input_ids"]] and p.body["prompt"] == p.prompts[0]
    assert p.prefill_only and p.max_new_tokens == 1
    p = parse("/v1/completions", {"prompt": TEXTS}, tok)
    assert p.prompts == sglang_tok(TEXTS)["input_ids"] and p.body["prompt"] == p.prompts
    assert p.max_new_tokens == DEFAULT_COMPLETION_MAX_TOKENS
    p = parse("/v1/completions", {"prompt": [[1, 2], [1, 3]]}, tok)
    assert p.prompts == [[1, 2], [1, 3]] and p.shared_prefix_len == 1
    # echo returns the prompt as written, so the text stays.
    p = parse("/v1/completions", {"prompt": "a b", "echo": True}, tok)
    assert p.body["prompt"] == "a b" and p.prompts == [sglang_tok("a b")["input_ids"]]


def test_score_text_is_tokenized_after_concatenation(tok, sglang_tok):
    query, items = "def __init__(", ["self", "cls", " path"]
    p = parse("/v1/score", {"query": query, "items": items, "label_token_ids": [5, 6]}, tok)
    expected = [sglang_tok(query + item)["input_ids"] for item in items]
    assert p.prompts == expected and p.affinity
    assert p.body["query"] == [] and p.body["items"] == expected
    assert p.prefill_only and p.max_new_tokens == 0 and not p.stream
    assert p.shared_prefix_len == len(tok.encode("def __init__"))  # BPE merges "(" with the item
    p = parse("/v1/score", {"query": query, "items": "x", "item_first": True, "label_token_ids": [5]}, tok)
    assert p.prompts == [sglang_tok("x" + query)["input_ids"]]
    p = parse("/v1/score", {"items": items, "label_token_ids": [5]}, tok)
    assert p.prompts == [sglang_tok(item)["input_ids"] for item in items]


def test_score_token_ids_are_concatenated(tok):
    body = {"query": [1, 2], "items": [[3], [4, 5]], "label_token_ids": [5]}
    p = parse("/v1/score", body, tok)
    assert p.prompts == [[1, 2, 3], [1, 2, 4, 5]] and p.body == body and p.shared_prefix_len == 2
    p = parse("/v1/score", {**body, "item_first": True}, tok)
    assert p.prompts == [[3, 1, 2], [4, 5, 1, 2]] and p.shared_prefix_len == 0
    p = parse("/v1/score", {"items": [[3], [4]], "label_token_ids": [5]}, tok)
    assert p.prompts == [[3], [4]]


def test_score_with_embedding_overrides_has_no_affinity(tok):
    body = {"query": "a", "items": ["b"], "label_token_ids": [5], "embed_override_token_id": 3,
            "query_embed_overrides": [[0.0]]}
    p = parse("/v1/score", body, tok)
    assert not p.affinity and p.body == body and p.prompts == [tok.encode("a") + tok.encode_plain("b")]


def test_chat_with_template(chat_tok, sglang_chat_tok):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f():"}]
    p = parse("/v1/chat/completions", {"messages": messages, "max_tokens": 1}, chat_tok)
    rendered = sglang_chat_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert p.prompts == [sglang_chat_tok.encode(rendered, add_special_tokens=False)]
    assert p.affinity and p.body["messages"] == messages and p.prefill_only
    # A last assistant turn becomes a user turn (serving_chat._handle_last_assistant_message).
    turned = [*messages, {"role": "assistant", "content": "ok"}]
    p = parse("/v1/chat/completions", {"messages": turned}, chat_tok)
    rendered = sglang_chat_tok.apply_chat_template([*messages, {"role": "user", "content": "ok"}], tokenize=False,
                                                   add_generation_prompt=True)
    assert p.prompts == [sglang_chat_tok.encode(rendered, add_special_tokens=False)]
    assert p.max_new_tokens == CONTEXT - len(p.prompts[0]) - 2 and not p.prefill_only
    # SGLang's user message model has no name field; other roles keep theirs.
    named = [{"role": "system", "content": "s", "name": "sys"}, {"role": "user", "content": "u", "name": "ann"}]
    p = parse("/v1/chat/completions", {"messages": named}, chat_tok)
    rendered = sglang_chat_tok.apply_chat_template([named[0], {"role": "user", "content": "u"}], tokenize=False,
                                                   add_generation_prompt=True)
    assert p.prompts == [sglang_chat_tok.encode(rendered, add_special_tokens=False)] and p.affinity
    # continue_final_message: the assistant text follows the generation prompt (an estimate: reasoning
    # parsers may prepend to it).
    p = parse("/v1/chat/completions", {"messages": turned, "continue_final_message": True}, chat_tok)
    rendered = sglang_chat_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert p.prompts == [sglang_chat_tok.encode(rendered, add_special_tokens=False) + sglang_chat_tok.encode("ok")]
    assert not p.affinity
    p = parse("/v1/chat/completions", {"messages": messages, "tools": [{"type": "function"}]}, chat_tok)
    assert not p.affinity


def test_chat_without_template_is_a_400(tok):
    """SGLang answers 400 (transformers: "tokenizer.chat_template is not set"); input_ids skip the template."""
    error = rejects("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}]}, tok,
                    status=400, match="no chat template")
    assert error.param == "messages"
    p = parse("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "input_ids": [7, 8]}, tok)
    assert p.affinity and p.prompts == [[7, 8]]


def test_decisions_prompts(chat_tok, sglang_chat_tok):
    decisions = pytest.importorskip("sglang.srt.entrypoints.openai.serving_decisions")
    protocol = pytest.importorskip("sglang.srt.entrypoints.openai.protocol")
    body = {"input": {"code": "x = 1"}, "questions": [
        {"id": "a", "type": "choice", "question": "Which?", "options": [{"name": "int", "description": "a number"},
                                                                         {"name": "str"}]},
        {"id": "b", "type": "score", "question": "How clean?", "levels": ["bad", "ok", "good"]},
        {"id": "c", "type": "yes_no", "question": "Valid?", "yes": "it parses"}]}
    p = parse("/v1/decisions", body, chat_tok)
    request = protocol.DecisionRequest(**body)
    text = decisions.render_text(request.input)
    expected = []
    for question in request.questions:
        view = decisions._decision_view(question)
        content = decisions.render_question(text=text, view=view, labels=decisions.default_labels(view))
        rendered = sglang_chat_tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                       add_generation_prompt=True)
        expected.append(sglang_chat_tok.encode(rendered, add_special_tokens=False))
    assert p.prompts == expected and p.affinity and p.prefill_only and p.max_new_tokens == 0
    assert p.body == body


def test_decisions_without_template_is_an_estimate(tok):
    body = {"input": "x", "questions": [{"id": "q", "type": "yes_no", "question": "y?"}]}
    p = parse("/v1/decisions", body, tok)
    assert not p.affinity and p.prompts[0]


# --- namespaces --------------------------------------------------------------------------------


def test_generate_namespace(tok):
    p = parse("/generate", {"text": "x", "lora_path": "ad", "cache_salt": "s", "extra_key": "k"}, tok)
    assert p.namespace == Namespace("ad", "s", "k") and not p.namespace.plain and p.affinity
    p = parse("/generate", {"text": "x", "cache_salt": "", "extra_key": ""}, tok)
    assert p.namespace.plain
    p = parse("/generate", {"text": ["x", "y"], "cache_salt": ["a", "b"]}, tok)
    assert not p.affinity and p.namespace.cache_salt == "a"
    p = parse("/generate", {"text": ["x", "y"], "lora_path": ["ad", "ad"]}, tok)
    assert p.affinity and p.namespace.lora_name == "ad"


def test_openai_namespace(chat_tok):
    p = parse("/v1/completions", {"prompt": "x", "model": f"{SERVED}:ad", "lora_path": "other", "cache_salt": "s"},
              chat_tok)
    assert p.namespace == Namespace("ad", "s", None)  # the adapter in model wins over lora_path
    p = parse("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "lora_path": "ad",
                                       "extra_key": "k"}, chat_tok)
    assert p.namespace == Namespace("ad", None, "k")
    p = parse("/v1/score", {"query": "x", "items": ["y"], "model": f"{SERVED}:ad", "label_token_ids": [5]}, chat_tok)
    assert p.namespace.plain  # /v1/score never applies an adapter


# --- parity with SGLang ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def protocol():
    return pytest.importorskip("sglang.srt.entrypoints.openai.protocol")


def _pydantic_names(model):
    assert all(f.alias is None for f in model.model_fields.values())
    return set(model.model_fields)


def test_generate_fields_match_sglang():
    io_struct = pytest.importorskip("sglang.srt.managers.io_struct")
    assert GENERATE_FIELDS == {f.name for f in dataclasses.fields(io_struct.GenerateReqInput)}


def test_openai_fields_match_sglang(protocol):
    assert COMPLETION_FIELDS == _pydantic_names(protocol.CompletionRequest)
    assert CHAT_FIELDS == _pydantic_names(protocol.ChatCompletionRequest)
    assert SCORE_FIELDS == _pydantic_names(protocol.ScoringRequest)
    assert DECISION_FIELDS == _pydantic_names(protocol.DecisionRequest)


def test_sglang_extra_field_policy(protocol):
    """What the module docstring says: unknown fields are dropped, except by DecisionRequest."""
    for model in (protocol.CompletionRequest, protocol.ChatCompletionRequest, protocol.ScoringRequest):
        assert model.model_config.get("extra", "ignore") == "ignore"
    assert protocol.DecisionRequest.model_config["extra"] == "forbid"
    chat = protocol.ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], reasoning={"effort": "low"})
    assert chat.reasoning_effort == "low" and CHAT_VALIDATOR_INPUTS == {"reasoning"}


def test_defaults_match_sglang(protocol):
    sampling = pytest.importorskip("sglang.srt.sampling.sampling_params")
    assert sampling.SamplingParams().max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert protocol.CompletionRequest.model_fields["max_tokens"].default == DEFAULT_COMPLETION_MAX_TOKENS
    assert protocol.ChatCompletionRequest.model_fields["max_tokens"].default is None
    assert protocol.ChatCompletionRequest.model_fields["max_completion_tokens"].default is None
