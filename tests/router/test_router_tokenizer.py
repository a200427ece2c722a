"""RouterTokenizer must produce the token ids SGLang's own tokenizer produces, without transformers."""

import json
from pathlib import Path

import pytest

import sgl_moe
from sgl_moe.router.router_tokenizer import ChatTemplateError, NoChatTemplate, RouterTokenizer

MODEL_DIR = Path(sgl_moe.__file__).parent / "models" / "tiny-qwen3-moe"
TEXTS = [
    "def foo(x):\n    return x  # hi",
    "  leading spaces\tand\ttabs\n\n",
    "<s> a </s> b <pad><unk>",
    "héllo wörld ✓ 中文 🙂",
    "import os, sys\nclass A(B):\n\tpass",
    "x",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] | trim }}{% if m.name is defined %} ({{ m.name | tojson }}){% endif %}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ eos_token }}{% endgeneration %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}"
)


def _files(config_overrides=None, post_processor=None):
    tokenizer_json = json.loads((MODEL_DIR / "tokenizer.json").read_text())
    if post_processor is not None:
        tokenizer_json["post_processor"] = post_processor
    config = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    for key, value in (config_overrides or {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return tokenizer_json, config


def _sglang_tokenizer(tmp_path, tokenizer_json, config):
    """The tokenizer an SGLang worker loads for these files."""
    hf = pytest.importorskip("sglang.srt.utils.hf_transformers.tokenizer")
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return hf.get_tokenizer(str(tmp_path), tokenizer_mode="auto")


@pytest.fixture(scope="module")
def router_tok():
    return RouterTokenizer.from_files((MODEL_DIR / "tokenizer.json").read_bytes(),
                                      json.loads((MODEL_DIR / "tokenizer_config.json").read_text()))


@pytest.fixture(scope="module")
def sglang_tok():
    hf = pytest.importorskip("sglang.srt.utils.hf_transformers.tokenizer")
    return hf.get_tokenizer(str(MODEL_DIR), tokenizer_mode="auto")


def test_shipped_model_encodes_like_sglang(router_tok, sglang_tok):
    assert router_tok.exact
    for text in TEXTS + [""]:
        assert router_tok.encode(text) == sglang_tok(text)["input_ids"], text
        assert router_tok.encode_plain(text) == sglang_tok.encode(text, add_special_tokens=False), text
    assert router_tok.encode_batch(TEXTS) == sglang_tok(TEXTS)["input_ids"]


def test_shipped_model_adds_no_bos(router_tok):
    assert router_tok.encode("x") == router_tok.encode_plain("x")
    assert router_tok.encode("x")[0] != router_tok.backend.token_to_id("<s>")


BOS_POST_PROCESSOR = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
}


@pytest.mark.parametrize("overrides,post_processor", [
    ({"add_bos_token": True}, None),  # transformers 5 drops the flag when tokenizer.json exists
    ({}, BOS_POST_PROCESSOR),  # the file's own post-processor adds BOS
    ({"tokenizer_class": None}, None),
    ({"additional_special_tokens": ["<x>"], "bos_token": "<bos2>"}, None),  # missing specials get new ids
    ({"split_special_tokens": True}, None),
], ids=["add_bos_flag_ignored", "bos_post_processor", "no_class", "missing_specials", "split_specials"])
def test_generic_backend_variants_encode_like_sglang(tmp_path, overrides, post_processor):
    tokenizer_json, config = _files(overrides, post_processor)
    sglang_tok = _sglang_tokenizer(tmp_path / "tok", tokenizer_json, config)
    router_tok = RouterTokenizer.from_files(json.dumps(tokenizer_json).encode(), config)
    assert router_tok.exact
    for text in TEXTS + ["<x>y<bos2>z", ""]:
        assert router_tok.encode(text) == sglang_tok(text)["input_ids"], text
        assert router_tok.encode_plain(text) == sglang_tok.encode(text, add_special_tokens=False), text


def test_model_specific_classes_are_not_exact():
    tokenizer_json, config = _files({"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True})
    tok = RouterTokenizer.from_files(json.dumps(tokenizer_json).encode(), config)
    assert not tok.exact
    assert tok.encode("x")[0] == tok.backend.token_to_id("<s>")  # SGLang restores Llama's BOS flag


def test_chat_template_renders_like_transformers(tmp_path):
    tokenizer_json, config = _files({"chat_template": CHAT_TEMPLATE})
    sglang_tok = _sglang_tokenizer(tmp_path / "tok", tokenizer_json, config)
    tok = RouterTokenizer.from_files(json.dumps(tokenizer_json).encode(), config)
    messages = [{"role": "system", "content": "be brief "}, {"role": "user", "content": "hi", "name": "ann"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "def f(): ✓"}]
    for kwargs in ({}, {"enable_thinking": False}):
        for add in (True, False):
            expected = sglang_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add, **kwargs)
            assert tok.apply_chat_template(messages, add_generation_prompt=add, **kwargs) == expected


def test_chat_template_errors(router_tok):
    with pytest.raises(NoChatTemplate):
        router_tok.apply_chat_template([{"role": "user", "content": "hi"}])
    tokenizer_json, config = _files({"chat_template": CHAT_TEMPLATE})
    tok = RouterTokenizer.from_files(json.dumps(tokenizer_json).encode(), config)
    with pytest.raises(ChatTemplateError, match="bad role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_named_chat_templates_use_the_first_as_sglang_does():
    tokenizer_json, config = _files({"chat_template": [{"name": "default", "template": "A{{ messages[0].content }}"},
                                                       {"name": "tool_use", "template": "B"}]})
    tok = RouterTokenizer.from_files(json.dumps(tokenizer_json).encode(), config)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "Ax"
