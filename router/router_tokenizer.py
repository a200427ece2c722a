"""The token ids an SGLang 0.5.23 worker computes for a prompt, without transformers.

SGLang loads its tokenizer with ``AutoTokenizer.from_pretrained`` (transformers 5,
``sglang/srt/utils/hf_transformers/tokenizer.py: get_tokenizer``) and encodes a ``/generate``
text prompt with ``tokenizer(text)["input_ids"]``, i.e. ``add_special_tokens=True``
(``sglang/srt/managers/tokenizer_manager.py: _tokenize_texts``). What that call adds depends on
the tokenizer class named in ``tokenizer_config.json``:

* The generic backend (no class, ``PreTrainedTokenizerFast`` or ``TokenizersBackend``) runs
  ``tokenizer.json`` as is: transformers drops ``add_bos_token`` / ``add_eos_token`` from the
  config when a ``tokenizer.json`` exists (``tokenization_utils_base.py: _from_pretrained``), so
  special tokens come only from the file's post-processor (none when it is null). Named special
  tokens of the config that the file lacks are added as special tokens
  (``tokenization_utils_tokenizers.py: TokenizersBackend.__init__``). This module reproduces that
  exactly (``exact`` is True).
* Model-specific classes (``LlamaTokenizerFast``, ``Qwen2Tokenizer``, ...) rebuild the normalizer
  and pre-tokenizer from class defaults in transformers 5, and SGLang restores ``add_bos_token``
  (default True) for the Llama, CodeLlama, Gemma and Cohere classes
  (``_fix_v5_add_bos_eos_token``). The ids here are then a best estimate (``exact`` is False) until
  the caller has checked them against the worker (e.g. its ``/v1/tokenize``) and set ``exact``.

Chat templates render as ``PreTrainedTokenizerBase.apply_chat_template(tokenize=False)`` does
(``transformers/utils/chat_template_utils.py``): a sandboxed Jinja environment with
``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, a non-escaping ``tojson``, the
``raise_exception`` and ``strftime_now`` helpers, and the named special tokens as variables.
A list of named templates resolves to the first one, as SGLang's template manager picks it
(``sglang/srt/parser/template_manager.py: _select_named_template``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer
from tokenizers.processors import TemplateProcessing

SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                            "mask_token")
"""transformers' named special tokens, in the order it adds missing ones; also the template variables."""

GENERIC_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
"""Classes transformers 5 loads as the plain ``tokenizer.json`` pipeline."""

BOS_RESTORING_CLASSES = frozenset({"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                   "CodeLlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast",
                                   "CohereTokenizerFast"})
"""Classes whose ``add_bos_token`` SGLang restores after loading (default True)."""


class NoChatTemplate(Exception):
    """The tokenizer config has no chat template."""


class ChatTemplateError(Exception):
    """The chat template failed to render these messages (``raise_exception`` or a Jinja error)."""


def _token_content(value: Any) -> str | None:
    """A special token as the config writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _added_token(value: Any) -> AddedToken:
    """The special AddedToken transformers adds for a config entry missing from ``tokenizer.json``."""
    if isinstance(value, dict):
        flags = {k: value[k] for k in ("single_word", "lstrip", "rstrip", "normalized") if k in value}
        return AddedToken(value["content"], special=True, **flags)
    return AddedToken(value, special=True)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body (HF uses it for assistant masks)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _chat_template_source(config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]: SGLang takes the first
        return template[0]["template"] if template else None
    if isinstance(template, dict):
        return next(iter(template.values()), None)
    return template or None


@dataclass
class RouterTokenizer:
    """Encodes prompts to the ids an SGLang worker prefills; renders the model's chat template."""

    backend: Tokenizer
    """``tokenizer.json`` with the post-processing and added tokens transformers applies."""
    special_tokens: dict[str, str]
    """Named special tokens (``bos_token``, ...) as strings: the chat template's variables."""
    exact: bool
    """True when ``encode`` is known to equal the worker's ids (see the module docstring)."""
    chat_template: str | None = None
    _template: jinja2.Template | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_files(cls, tokenizer_json: bytes, tokenizer_config: dict | None) -> RouterTokenizer:
        """Build from the bytes of ``tokenizer.json`` and the parsed ``tokenizer_config.json``."""
        config = tokenizer_config or {}
        backend = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        backend.no_truncation()  # transformers disables both for an untruncated, unpadded call
        backend.no_padding()

        present = {token.content for token in backend.get_added_tokens_decoder().values()}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        if isinstance(extra, dict):
            extra = list(extra.values())
        for value in [config.get(attr) for attr in SPECIAL_TOKEN_ATTRIBUTES] + list(extra):
            content = _token_content(value)
            if content is not None and content not in present:
                backend.add_tokens([_added_token(value)])
                present.add(content)
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))

        special_tokens = {attr: _token_content(config[attr]) for attr in SPECIAL_TOKEN_ATTRIBUTES
                          if _token_content(config.get(attr)) is not None}
        tokenizer_class = config.get("tokenizer_class")
        if tokenizer_class in BOS_RESTORING_CLASSES and config.get("add_bos_token", True) is not False:
            bos = special_tokens.get("bos_token")
            if bos is not None and backend.token_to_id(bos) is not None:
                backend.post_processor = TemplateProcessing(
                    single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                    special_tokens=[(bos, backend.token_to_id(bos))])
        exact = tokenizer_class is None or tokenizer_class in GENERIC_TOKENIZER_CLASSES
        return cls(backend=backend, special_tokens=special_tokens, exact=exact,
                   chat_template=_chat_template_source(config))

    def encode(self, text: str) -> list[int]:
        """The ids SGLang prefills for ``text`` sent to ``/generate`` (special tokens added)."""
        return self.backend.encode(text, add_special_tokens=True).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` for each text, in parallel (tokenizers' thread pool)."""
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=True)]

    def encode_plain(self, text: str) -> list[int]:
        """The ids of ``text`` with no special tokens added (chat prompts, score items)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kw: Any) -> str:
        """The chat prompt as text, as HF's ``apply_chat_template(tokenize=False)`` renders it.

        ``kw`` are extra template variables (``tools``, ``chat_template_kwargs`` entries); they
        override the special-token variables. Raises NoChatTemplate or ChatTemplateError.
        """
        if self.chat_template is None:
            raise NoChatTemplate("this model's tokenizer config has no chat template")
        if self._template is None:
            try:
                self._template = _compile_template(self.chat_template)
            except jinja2.TemplateError as e:
                raise ChatTemplateError(f"the chat template does not compile: {e}") from e
        variables = {"tools": None, "documents": None, **self.special_tokens, **kw}
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **variables)
        except (jinja2.TemplateError, TypeError, ValueError) as e:
            raise ChatTemplateError(str(e)) from e
