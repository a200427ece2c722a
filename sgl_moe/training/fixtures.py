"""Test models that look like real checkpoints: the shipped weights behind a real model family's tokenizer.

    python -m sgl_moe.training.fixtures --kind qwen|llama|all --out ROOT    # builds ROOT/<kind>/

``qwen``: a byte-level BPE (GPT-2 / Qwen2 layout: NFC, Qwen2's split regex, ByteLevel pre-tokenizer and decoder)
trained on the project corpus, shipped as ``tokenizer.json`` + ``vocab.json`` + ``merges.txt``, declared
``Qwen2Tokenizer``: no BOS, eos ``<|im_end|>``, pad ``<|endoftext|>``, special tokens after the BPE vocabulary
(``<think>``/``</think>`` are added but not special, as in Qwen3), fewer tokens than embedding rows (as Qwen3), and a
ChatML template with Qwen3's ``enable_thinking`` switch.
``llama``: the shipped sentencepiece model declared ``LlamaTokenizerFast`` (a backward alias of ``LlamaTokenizer``
in transformers 5): dummy-prefix ``▁``, BOS added by the ``tokenizer.json`` post-processor, and a Mistral-Instruct
``[INST] ... [/INST]`` template that starts with ``{{ bos_token }}`` as Mistral's and Llama-2-chat's do (whoever
renders it to text must encode without special tokens, or the prompt gets two BOS).

Weights are the shipped ``model.safetensors`` (symlinked; every id is < 4096, its embedding's row count);
``config.json`` and ``generation_config.json`` are copied with the new tokenizer's special ids. A build is
deterministic (same bytes every run) and takes seconds; a complete build with a matching stamp is kept.
Built at test time (``build``, the ``qwen_model_dir`` / ``llama_model_dir`` fixtures), never committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from sgl_moe import DEFAULT_MODEL_DIR

logger = logging.getLogger("sgl_moe.training.fixtures")

KINDS = ("qwen", "llama")
FORMAT_VERSION = 1
"""Bump when the layout of a build changes; part of the stamp."""
STAMP = ".fixture-stamp.json"
EMBEDDING_ROWS = 4096
"""Rows of the shipped model's embedding: every token id of a fixture must be below it."""
QWEN_TOKENS = 4080
"""BPE vocabulary plus added tokens of the qwen tokenizer. The last 16 embedding rows stay unused: Qwen3 pads its
embedding the same way (151,669 tokens, 151,936 rows), so ``len(tokenizer) < config.vocab_size`` is covered."""

# Qwen2's pre-tokenizer split (the same regex transformers' Qwen2Tokenizer builds).
QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
              r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_ADDED = (("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
              ("<think>", False), ("</think>", False))
"""Added after the BPE vocabulary in this order, as Qwen3 numbers them; (content, special)."""

QWEN_CHAT_TEMPLATE = """\
{#- ChatML as Qwen3 renders it, tool-less. Assistant turns before the last user turn lose their <think> block;
    enable_thinking=false pre-fills an empty one so the model answers directly. -#}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
  {%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- set content = m['content'] if m['content'] is string else '' -%}
  {%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}
    {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
  {%- endif -%}
  {{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}
"""

LLAMA_CHAT_TEMPLATE = """\
{#- Mistral-Instruct layout: BOS, then [INST] user [/INST] assistant</s> turns; a system message is folded into
    the first user turn. The generation prompt is the closing [/INST] itself. -#}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system = none -%}{%- set turns = messages -%}
{%- endif -%}
{{- bos_token -}}
{%- for m in turns -%}
  {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('after an optional system message, roles must alternate user/assistant') -}}
  {%- endif -%}
  {%- if m['role'] == 'user' -%}
    {%- set text = system + '\\n\\n' + m['content'] if loop.first and system is not none else m['content'] -%}
    {{- '[INST] ' + text + ' [/INST]' -}}
  {%- elif m['role'] == 'assistant' -%}
    {{- ' ' + m['content'] + eos_token -}}
  {%- else -%}
    {{- raise_exception('only system, user and assistant roles are supported') -}}
  {%- endif -%}
{%- endfor -%}
"""


def _dump(obj) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def _write_model_files(out: Path, bos: int | None, eos: int, pad: int | None, gen_eos: list[int]) -> None:
    """Shipped weights (symlink) and config with this tokenizer's special ids."""
    for name, value in (("bos", bos), ("eos", eos), ("pad", pad), *(("gen_eos", i) for i in gen_eos)):
        if value is not None and not 0 <= value < EMBEDDING_ROWS:
            raise ValueError(f"{name} id {value} is outside the shipped embedding ({EMBEDDING_ROWS} rows)")
    (out / "model.safetensors").symlink_to(DEFAULT_MODEL_DIR / "model.safetensors")
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    config.update(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    (out / "config.json").write_text(_dump(config))
    generation = json.loads((DEFAULT_MODEL_DIR / "generation_config.json").read_text())
    generation.update(bos_token_id=bos, eos_token_id=gen_eos if len(gen_eos) > 1 else gen_eos[0], pad_token_id=pad)
    (out / "generation_config.json").write_text(_dump({k: v for k, v in generation.items() if v is not None}))


def _build_qwen(out: Path) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    from sgl_moe.training.corpus import load_corpus

    corpus = load_corpus()
    logger.info("corpus: %d train files, %.1f M chars", len(corpus.train), corpus.train_chars / 1e6)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # The trainer is deterministic for a given corpus order, whatever the thread count (checked by a test).
    trainer = BpeTrainer(vocab_size=QWEN_TOKENS - len(QWEN_ADDED), min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus.train, trainer=trainer)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    logger.info("byte-level BPE trained: %d tokens", tok.get_vocab_size())
    for content, special in QWEN_ADDED:  # one by one: ids follow this order
        token = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    ids = {content: tok.token_to_id(content) for content, _ in QWEN_ADDED}
    if tok.get_vocab_size() != QWEN_TOKENS:
        raise RuntimeError(f"qwen tokenizer has {tok.get_vocab_size()} tokens, expected {QWEN_TOKENS}")
    tok.save(str(out / "tokenizer.json"))

    model = json.loads(tok.to_str())["model"]
    (out / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False, separators=(",", ":")))
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in model["merges"]))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[content]): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                "single_word": False, "special": special}
            for content, special in QWEN_ADDED},
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": QWEN_CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(_dump(config))
    # As Qwen3: the model config's BOS is <|endoftext|> (never prepended); generation stops on either end token.
    _write_model_files(out, bos=ids["<|endoftext|>"], eos=ids["<|im_end|>"], pad=ids["<|endoftext|>"],
                       gen_eos=[ids["<|im_end|>"], ids["<|endoftext|>"]])


def _build_llama(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors

    # The shipped export has the same vocabulary and merge order as tokenizer.model; only the Llama layout
    # changes: a dummy-prefix Metaspace (what LlamaTokenizer builds, legacy=False), Strip in the decoder, BOS.
    tok = Tokenizer.from_file(str(DEFAULT_MODEL_DIR / "tokenizer.json"))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    tok.save(str(out / "tokenizer.json"))
    logger.info("sentencepiece vocabulary in the Llama layout: %d tokens", tok.get_vocab_size())

    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    # Llama's sentencepiece models add the dummy prefix too, so tokenizer.model and tokenizer.json agree.
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((DEFAULT_MODEL_DIR / "tokenizer.model").read_bytes())
    proto.normalizer_spec.add_dummy_prefix = True
    (out / "tokenizer.model").write_bytes(proto.SerializeToString(deterministic=True))
    spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))  # it still loads

    config = {
        "tokenizer_class": "LlamaTokenizerFast",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": LLAMA_CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(_dump(config))
    (out / "special_tokens_map.json").write_text(_dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    _write_model_files(out, bos=bos, eos=eos, pad=None, gen_eos=[eos])


_BUILDERS = {"qwen": _build_qwen, "llama": _build_llama}


def _stamp_key(kind: str) -> str:
    """What a build depends on: this module, the shipped model's files and (for qwen) the corpus' Python."""
    h = hashlib.sha256(f"{FORMAT_VERSION}\0{kind}\0{sys.version}\0".encode())
    h.update(Path(__file__).read_bytes())
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer.model"):
        h.update((DEFAULT_MODEL_DIR / name).read_bytes())
    h.update(str(DEFAULT_MODEL_DIR / "model.safetensors").encode())
    return h.hexdigest()


def is_complete(model_dir: Path, kind: str) -> bool:
    """A finished build of this kind by this code: the stamp (written last) matches and its files are there."""
    try:
        stamp = json.loads((model_dir / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("kind") == kind and stamp.get("key") == _stamp_key(kind)
            and all((model_dir / name).exists() for name in stamp.get("files", [])))


def build(kind: str, root: Path) -> Path:
    """Build ``root/kind`` (kept if already complete) and return it. Staged beside it, then renamed into place."""
    if kind not in _BUILDERS:
        raise ValueError(f"unknown fixture kind {kind!r}; choose from {', '.join(KINDS)}")
    out = Path(root) / kind
    if is_complete(out, kind):
        logger.info("%s: complete build in %s, kept", kind, out)
        return out
    if out.exists() and any(out.iterdir()) and not (out / STAMP).exists():
        raise FileExistsError(f"{out} exists and is not a fixture build; not overwriting it")
    started = time.monotonic()
    stage = out.with_name(f".{kind}.partial")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    _BUILDERS[kind](stage)
    files = sorted(p.name for p in stage.iterdir())
    (stage / STAMP).write_text(_dump({"kind": kind, "key": _stamp_key(kind), "files": files}))
    shutil.rmtree(out, ignore_errors=True)
    stage.rename(out)
    logger.info("%s: built %s in %.1f s (%s)", kind, out, time.monotonic() - started, ", ".join(files))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sgl_moe.training.fixtures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=[*KINDS, "all"], default="all")
    parser.add_argument("--out", type=Path, required=True, help="root folder; each kind is built in OUT/<kind>/")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[fixtures] %(message)s")
    for kind in KINDS if args.kind == "all" else (args.kind,):
        print(build(kind, args.out))


if __name__ == "__main__":
    main()
