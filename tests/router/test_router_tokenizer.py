"""RouterTokenizer must produce the token ids and chat prompts SGLang's own tokenizer produces, for every class
transformers loads: the shipped generic tokenizer, the Qwen2 and Llama fixture models, and the shipped
``tokenizer.json`` declared as other classes (which rebuild its pipeline from class defaults)."""

import json
import shutil

import pytest

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.router.request.router_tokenizer import (
    LOAD_KWARGS,
    SPECIAL_TOKEN_ATTRIBUTES,
    ChatTemplateError,
    NoChatTemplate,
    RouterTokenizer,
)
from sgl_moe.worker.info import tokenizer_files

PROBES = [
    "", "x", "Hello World", " Hello", "hello\n", "a\n\nb",
    "def foo(x):\n    return x  # hi", "import os, sys\nclass A(B):\n\tpass", "for (i = 0; i < n; ++i) { s += a[i]; }",
    "  leading spaces\tand\ttabs\n\n", "   ", "\n\n\n  \t ", "a\r\nb\rc", "x\u00a0y", "trailing   ",
    "héllo wörld ✓ 中文 🙂", "e\u0301 vs \u00e9", "Ελλάδα مرحبا 日本語 한국어", "🙂🙃👍🏽👨‍👩‍👧", "\ufffd\u200b",
    "<s> a </s> b <pad><unk>", "<s><s></s>", "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>x",
    "<think>\nmaybe\n</think>\n\nyes", "[INST] hi [/INST]", "<|im_start|<|im_end|>",
]
LONG = " ".join(PROBES) * 60  # ~20,000 characters
MESSAGES = [{"role": "system", "content": "be brief "}, {"role": "user", "content": "hi ✓"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nhello"},
            {"role": "user", "content": "def f(): 1"}]

# The shipped tokenizer.json declared as a model-specific class: transformers 5 rebuilds normalizer, pre-tokenizer
# and post-processor from the class's defaults, and SGLang restores Llama's BOS flag.
DECLARED = {
    "as-qwen2": {"tokenizer_class": "Qwen2Tokenizer"},
    "as-gpt2": {"tokenizer_class": "GPT2Tokenizer"},
    "as-llama-fast-bos": {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True},
    "as-llama-bos-default": {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": None},
    "as-codellama": {"tokenizer_class": "CodeLlamaTokenizer", "add_bos_token": True},  # overrides encoding
}
BOS_POST_PROCESSOR = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
}
GENERIC = {  # variants of the generic backend
    "add-bos-flag-ignored": {"add_bos_token": True},  # transformers 5 drops it when tokenizer.json exists
    "no-class": {"tokenizer_class": None},
    "missing-specials": {"additional_special_tokens": ["<x>"], "bos_token": "<bos2>"},  # added with new ids
    "split-specials": {"split_special_tokens": True},
    "named-templates": {"chat_template": [{"name": "default", "template": "A{{ messages[0].content }}"},
                                          {"name": "tool_use", "template": "B"}]},
}


def shipped_variant(root, name, overrides, post_processor=None):
    """A copy of the shipped tokenizer files with ``tokenizer_config.json`` changed (a None value removes a key)."""
    out = root / name
    out.mkdir()
    for file in tokenizer_files(str(DEFAULT_MODEL_DIR)).files:
        shutil.copy(DEFAULT_MODEL_DIR / file, out / file)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.update(overrides)
    (out / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    if post_processor is not None:
        tokenizer_json = json.loads((out / "tokenizer.json").read_text())
        tokenizer_json["post_processor"] = post_processor
        (out / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    return out


@pytest.fixture(scope="module")
def variants_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizer-variants")


def variant_dir(name, request, variants_root):
    """The directory of a named variant (built once per module)."""
    if name == "shipped":
        return DEFAULT_MODEL_DIR
    if name in ("qwen", "llama"):
        return request.getfixturevalue(f"{name}_model_dir")
    if (variants_root / name).exists():
        return variants_root / name
    if name == "bos-post-processor":  # the file's own post-processor adds BOS
        return shipped_variant(variants_root, name, {}, BOS_POST_PROCESSOR)
    return shipped_variant(variants_root, name, {**DECLARED, **GENERIC}[name])


@pytest.fixture(params=["shipped", "qwen", "llama", *DECLARED, *GENERIC, "bos-post-processor"])
def model_dir(request, variants_root):
    return variant_dir(request.param, request, variants_root)


def served(model_dir) -> RouterTokenizer:
    """The router's tokenizer from the files a worker serving ``model_dir`` offers, as discovery fetches them."""
    files = tokenizer_files(str(model_dir)).files
    return RouterTokenizer.from_file_bytes({name: (model_dir / name).read_bytes() for name in files})


def sglang_tokenizer(model_dir):
    """What an SGLang worker loads for this directory (AutoTokenizer plus SGLang's post-load fixes)."""
    hf = pytest.importorskip("sglang.srt.utils.hf_transformers.tokenizer")
    return hf.get_tokenizer(str(model_dir), tokenizer_mode="auto")


def test_encodes_like_sglang(model_dir):
    router, sglang = served(model_dir), sglang_tokenizer(model_dir)
    assert router.exact and type(router.hf) is type(sglang)
    for text in [*PROBES, LONG]:
        assert router.encode(text) == sglang(text)["input_ids"], text
        assert router.encode_plain(text) == sglang.encode(text, add_special_tokens=False), text
    assert router.encode_batch([*PROBES, LONG]) == sglang([*PROBES, LONG])["input_ids"]
    assert router.encode_batch([]) == []
    assert router.special_tokens == {k: v for k, v in sglang.special_tokens_map.items()
                                     if k in SPECIAL_TOKEN_ATTRIBUTES and isinstance(v, str)}


@pytest.mark.parametrize("name", ["shipped", "qwen", "as-qwen2", "as-gpt2", "no-class", "missing-specials"])
def test_encodes_like_auto_tokenizer_where_sglang_changes_nothing(name, request, variants_root):
    """Classes SGLang applies no fix to: plain ``AutoTokenizer.from_pretrained`` gives the same ids."""
    from transformers import AutoTokenizer

    model_dir = variant_dir(name, request, variants_root)
    auto = AutoTokenizer.from_pretrained(str(model_dir), **LOAD_KWARGS)
    router = served(model_dir)
    assert router.encode_batch([*PROBES, LONG]) == auto([*PROBES, LONG])["input_ids"]


@pytest.mark.parametrize("kind", ["qwen", "llama"])
def test_chat_template_renders_like_sglang(kind, request):
    model_dir = request.getfixturevalue(f"{kind}_model_dir")
    router, sglang = served(model_dir), sglang_tokenizer(model_dir)
    conversations = [MESSAGES[1:2], MESSAGES] if kind == "qwen" else [MESSAGES[1:2], MESSAGES[:2], MESSAGES[:4]]
    for messages in conversations:
        for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
            for add in (True, False):
                expected = sglang.apply_chat_template(messages, tokenize=False, add_generation_prompt=add,
                                                      return_dict=False, **kwargs)
                text = router.apply_chat_template(messages, add_generation_prompt=add, **kwargs)
                assert text == expected
                # SGLang encodes the rendered prompt without special tokens (the template wrote them)
                assert router.encode_plain(text) == sglang.encode(text, add_special_tokens=False)


def test_qwen3_template_switches_thinking_off(qwen_model_dir):
    text = served(qwen_model_dir).apply_chat_template(MESSAGES[1:2], enable_thinking=False)
    assert text == "<|im_start|>user\nhi ✓<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_llama_template_starts_with_one_bos(llama_model_dir):
    tok = served(llama_model_dir)
    text = tok.apply_chat_template(MESSAGES[:2])
    assert text == "<s>[INST] be brief \n\nhi ✓ [/INST]"
    bos = tok.backend.token_to_id("<s>")
    assert tok.encode_plain(text).count(bos) == 1 and tok.encode(text)[:2] == [bos, bos]


def test_chat_template_errors(llama_model_dir):
    with pytest.raises(NoChatTemplate):
        served(DEFAULT_MODEL_DIR).apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="alternate"):
        served(llama_model_dir).apply_chat_template([{"role": "user", "content": "a"},
                                                     {"role": "user", "content": "b"}])


def test_named_chat_templates_use_the_first_as_sglang_does(variants_root):
    tok = served(variant_dir("named-templates", None, variants_root))
    assert tok.chat_template == "A{{ messages[0].content }}"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "Ax"


def test_additional_chat_templates_are_served_and_loaded(tmp_path, qwen_model_dir):
    model_dir = tmp_path / "m"
    shutil.copytree(qwen_model_dir, model_dir, symlinks=True)
    (model_dir / "additional_chat_templates").mkdir()
    (model_dir / "additional_chat_templates" / "tool_use.jinja").write_text("T{{ messages[0].content }}")
    files = tokenizer_files(str(model_dir)).files
    assert "additional_chat_templates/tool_use.jinja" in files
    router, sglang = served(model_dir), sglang_tokenizer(model_dir)
    assert router.chat_template == (sglang.chat_template if isinstance(sglang.chat_template, str)
                                    else next(iter(sglang.chat_template.values())))


def test_unloadable_class_falls_back_to_the_generic_loader_not_exact(variants_root):
    """A tokenizer class in remote code (a worker started with --trust-remote-code): the router runs no remote
    code, so it loads transformers' generic class over tokenizer.json and does not claim exact ids."""
    model_dir = shipped_variant(variants_root, "remote-code",
                                {"tokenizer_class": "FooTokenizer", "auto_map": {"AutoTokenizer": ["t.Foo", None]}})
    (model_dir / "config.json").unlink()  # Qwen3-MoE's model type would make transformers skip the remote code
    tok = RouterTokenizer.from_dir(model_dir)
    assert not tok.exact and "trust_remote_code" in tok.inexact_reason
    assert tok.encode("Hello World") == served(DEFAULT_MODEL_DIR).encode("Hello World")


def test_the_pool_can_stop_trusting_the_ids():
    tok = served(DEFAULT_MODEL_DIR)
    tok.mark_inexact("the worker's /v1/tokenize disagreed")
    assert not tok.exact and tok.inexact_reason == "the worker's /v1/tokenize disagreed"


def test_file_names_outside_the_tokenizer_set_are_refused():
    for name in ("../x", "/etc/passwd", "model.safetensors", "additional_chat_templates/../../x.jinja"):
        with pytest.raises(ValueError, match="not a tokenizer file name"):
            RouterTokenizer.from_file_bytes({name: b"{}"})


def test_two_file_constructor_still_works():
    tok = RouterTokenizer.from_files((DEFAULT_MODEL_DIR / "tokenizer.json").read_bytes(),
                                     json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text()))
    assert tok.exact and tok.encode_batch(PROBES) == served(DEFAULT_MODEL_DIR).encode_batch(PROBES)
