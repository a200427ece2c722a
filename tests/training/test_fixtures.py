"""The test models that look like real checkpoints (sgl_moe.training.fixtures) load as their family's tokenizer
in transformers, round-trip text, stay inside the shipped embedding, render their chat templates, agree with the
files other loaders read (raw tokenizer.json, vocab.json + merges.txt, tokenizer.model), and build reproducibly."""

import hashlib
import json
import shutil
import unicodedata

import pytest

from sgl_moe.training import fixtures

transformers = pytest.importorskip("transformers")

TEXT = [
    "hello world",
    "héllo wörld — naïve café, 日本語, emoji 🙂👍🏽 and NFC: e\u0301",
    "a    b\t\tc\n\n\n  d   ",
    'def f(x):\n    """doc"""\n    return {"k": [1, 2]}  # ok\n',
    "if x:\n        y = 1\n",
    "class A(B):\n\tpass\r\n",
    "x" * 300,
]
LEADING_SPACE = ["  two leading spaces", " one", "\n\nnewlines first"]


@pytest.fixture(scope="module")
def qwen(qwen_model_dir):
    return transformers.AutoTokenizer.from_pretrained(qwen_model_dir)


@pytest.fixture(scope="module")
def llama(llama_model_dir):
    return transformers.AutoTokenizer.from_pretrained(llama_model_dir)


def _tree_digest(root):
    """File name -> sha256 (symlinks by target), for every file of every kind under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ---- qwen ----------------------------------------------------------------------------------------------------


def test_qwen_loads_as_qwen2_tokenizer_without_bos(qwen):
    assert type(qwen).__name__ == "Qwen2Tokenizer"
    assert qwen.bos_token is None
    assert (qwen.eos_token, qwen.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert qwen.encode("hi") == qwen.encode("hi", add_special_tokens=False)


@pytest.mark.parametrize("text", TEXT + LEADING_SPACE)
def test_qwen_round_trips_text(qwen, text):
    ids = qwen.encode(text)
    # NFC is the one normalisation a byte-level BPE applies.
    assert qwen.decode(ids) == unicodedata.normalize("NFC", text)
    assert max(ids) < fixtures.EMBEDDING_ROWS


def test_qwen_added_tokens_follow_the_bpe_vocabulary_as_in_qwen3(qwen):
    ids = {content: qwen.convert_tokens_to_ids(content) for content, _ in fixtures.QWEN_ADDED}
    assert list(ids.values()) == list(range(fixtures.QWEN_TOKENS - 5, fixtures.QWEN_TOKENS))
    assert len(qwen) == fixtures.QWEN_TOKENS < fixtures.EMBEDDING_ROWS
    for content, token_id in ids.items():
        assert qwen.encode(content) == [token_id]
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nok<|im_end|><|endoftext|>"
    ids_ = qwen.encode(text)
    assert qwen.decode(ids_) == text
    # <think> and </think> are added but not special (Qwen3): they survive skip_special_tokens.
    assert qwen.decode(ids_, skip_special_tokens=True) == "user\nhi\nassistant\n<think>\nhm\n</think>\n\nok"


def test_qwen_chat_template(qwen):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    render = qwen.apply_chat_template
    assert render(chat, tokenize=False, add_generation_prompt=True) == head
    assert render(chat, tokenize=False, add_generation_prompt=True, enable_thinking=True) == head
    assert render(chat, tokenize=False, add_generation_prompt=True, enable_thinking=False) == \
        head + "<think>\n\n</think>\n\n"
    assert render(chat, tokenize=False, add_generation_prompt=False) == head.removesuffix("<|im_start|>assistant\n")
    # An earlier assistant turn loses its reasoning, as Qwen3 renders history.
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"},
               {"role": "user", "content": "Again"}]
    assert render(history, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_vocab_and_merges_files_match_tokenizer_json(qwen, qwen_model_dir, tmp_path):
    """A loader that reads vocab.json + merges.txt (no tokenizer.json) gets the same ids."""
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json"):
        shutil.copy(qwen_model_dir / name, tmp_path / name)
    slow_path = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in [*TEXT, "<|im_start|>user\n<think>x</think><|im_end|>"]:
        assert slow_path.encode(text) == qwen.encode(text), text


# ---- llama ---------------------------------------------------------------------------------------------------


def test_llama_loads_as_llama_tokenizer_fast_and_adds_bos(llama, llama_model_dir):
    config = json.loads((llama_model_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "LlamaTokenizerFast"
    # transformers 5 keeps LlamaTokenizerFast as a backward alias of its one (tokenizers-backed) LlamaTokenizer.
    assert type(llama) is transformers.LlamaTokenizerFast
    assert type(llama).__name__ == "LlamaTokenizer"
    assert (llama.bos_token_id, llama.eos_token_id, llama.pad_token) == (1, 2, None)
    ids = llama.encode("hello world")
    assert ids[0] == 1 and ids.count(1) == 1
    assert llama.encode("hello world", add_special_tokens=False) == ids[1:]
    assert llama.encode("") == [1]


@pytest.mark.parametrize("text", TEXT)
def test_llama_round_trips_text(llama, text):
    ids = llama.encode(text)
    assert llama.decode(ids, skip_special_tokens=True) == text
    assert max(ids) < fixtures.EMBEDDING_ROWS


@pytest.mark.parametrize("text", LEADING_SPACE)
def test_llama_drops_one_leading_space_like_real_llama(llama, text):
    """The Metaspace pre-tokenizer adds no dummy prefix to text that already starts with a space, and the decoder
    strips one: text starting with a space loses it on the way back (as Llama-2/Mistral under transformers 5)."""
    decoded = llama.decode(llama.encode(text), skip_special_tokens=True)
    assert decoded == (text[1:] if text.startswith(" ") else text)


def test_llama_special_tokens(llama):
    assert llama.encode("<s></s>", add_special_tokens=False) == [1, 2]
    text = "[INST] hi [/INST] ok</s>[INST] again [/INST]"
    ids = llama.encode(text)
    assert ids.count(2) == 1
    assert llama.decode(ids[1:]) == text
    assert llama.decode(ids, skip_special_tokens=True) == text.replace("</s>", "")
    assert llama.convert_ids_to_tokens([0, 1, 2]) == ["<unk>", "<s>", "</s>"]
    assert len(llama) <= fixtures.EMBEDDING_ROWS


def test_llama_chat_template_starts_with_bos_as_mistral(llama):
    render = llama.apply_chat_template
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(chat, tokenize=False, add_generation_prompt=True) == "<s>[INST] Be brief.\n\nHi [/INST]"
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
             {"role": "user", "content": "Again"}]
    assert render(turns, tokenize=False, add_generation_prompt=True) == \
        "<s>[INST] Hi [/INST] Hello</s>[INST] Again [/INST]"
    # Tokenizing the template adds no second BOS; encoding its text must skip special tokens for the same ids.
    ids = render(turns, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids.count(1) == 1 and ids[0] == 1
    text = render(turns, tokenize=False, add_generation_prompt=True)
    assert llama.encode(text, add_special_tokens=False) == ids
    assert llama.encode(text)[:2] == [1, 1]
    with pytest.raises(Exception, match="alternate"):
        render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], tokenize=False)


def test_llama_sentencepiece_model_agrees_with_tokenizer_json(llama, llama_model_dir):
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(llama_model_dir / "tokenizer.model"))
    assert sp.get_piece_size() == len(llama)
    for text in TEXT:  # not LEADING_SPACE: sentencepiece always adds the dummy prefix, Metaspace("first") does not
        assert sp.encode(text) == llama.encode(text, add_special_tokens=False), text


# ---- both ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", fixtures.KINDS)
def test_raw_tokenizer_json_agrees_with_transformers(kind, request):
    """What a light process (the router) loads with ``tokenizers`` alone encodes and decodes as transformers does."""
    from tokenizers import Tokenizer

    model_dir = request.getfixturevalue(f"{kind}_model_dir")
    tok = request.getfixturevalue(kind)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert raw.get_vocab_size() <= fixtures.EMBEDDING_ROWS
    assert max(raw.get_vocab().values()) < fixtures.EMBEDDING_ROWS
    for text in [*TEXT, *LEADING_SPACE, "<|im_start|>x<|im_end|>", "<s>[INST] x [/INST]</s>"]:
        ids = tok.encode(text)
        assert raw.encode(text).ids == ids, text
        assert raw.decode(ids, skip_special_tokens=False) == tok.decode(ids), text


@pytest.mark.parametrize("kind", fixtures.KINDS)
def test_model_config_carries_the_tokenizer_special_ids(kind, request):
    model_dir = request.getfixturevalue(f"{kind}_model_dir")
    tok = request.getfixturevalue(kind)
    config = json.loads((model_dir / "config.json").read_text())
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert config["vocab_size"] == fixtures.EMBEDDING_ROWS
    assert config["eos_token_id"] == tok.eos_token_id
    eos = generation["eos_token_id"]
    assert tok.eos_token_id in (eos if isinstance(eos, list) else [eos])
    if kind == "qwen":
        assert config["bos_token_id"] == config["pad_token_id"] == tok.pad_token_id
        assert eos == [tok.eos_token_id, tok.pad_token_id]
    else:
        assert config["bos_token_id"] == generation["bos_token_id"] == tok.bos_token_id
        assert config["pad_token_id"] is None and "pad_token_id" not in generation
    assert (model_dir / "model.safetensors").resolve() == (fixtures.DEFAULT_MODEL_DIR / "model.safetensors")


def test_build_is_reproducible_and_idempotent(tmp_path, fixture_models_root, qwen_model_dir, llama_model_dir):
    """A fresh build has the same bytes as the session's; building again over a complete build keeps it."""
    for kind in fixtures.KINDS:
        fixtures.build(kind, tmp_path)
    assert _tree_digest(tmp_path) == _tree_digest(fixture_models_root)
    before = {p: p.lstat().st_mtime_ns for p in tmp_path.rglob("*")}
    for kind in fixtures.KINDS:
        assert fixtures.build(kind, tmp_path) == tmp_path / kind
    assert {p: p.lstat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_build_refuses_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        fixtures.build("qwen", tmp_path)
    assert (tmp_path / "qwen" / "precious.txt").read_text() == "keep me"


def test_a_changed_stamp_rebuilds(tmp_path):
    out = fixtures.build("llama", tmp_path)
    (out / fixtures.STAMP).write_text(json.dumps({"kind": "llama", "key": "old", "files": []}))
    assert not fixtures.is_complete(out, "llama")
    fixtures.build("llama", tmp_path)
    assert fixtures.is_complete(out, "llama")
