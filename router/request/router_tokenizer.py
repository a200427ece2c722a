"""The token ids an SGLang 0.5.23 worker computes for a prompt: the worker's own tokenizer, loaded as SGLang loads it.

Loading (``load_like_sglang``) repeats SGLang's ``get_tokenizer``
(``sglang/srt/utils/hf_transformers/tokenizer.py``) for a local directory holding the files the worker serves
(``wire.TokenizerFiles``), without importing sglang: ``AutoTokenizer.from_pretrained`` with SGLang's arguments,
its retry when that gives the generic ``TokenizersBackend`` (``_resolve_tokenizers_backend``), then its post-load
fixes; each step names the function it mirrors. Not mirrored (the worker is then still served, but the ids may
differ, which the pool's check against the worker catches): GGUF and tiktoken files, mistral-common tokenizers,
remote code (the worker's ``--trust-remote-code``), ``--tokenizer-backend fastokens``, multimodal processors.

Encoding is what the tokenizer manager does with ``/generate`` text (``tokenizer_manager.py: _tokenize_texts``):
``tokenizer(texts)["input_ids"]`` for a fast tokenizer, ``tokenizer.encode(text)`` for each text otherwise;
special tokens added. Chat prompts render with ``apply_chat_template(tokenize=False, return_dict=False)`` as
``serving_chat.py: _render_and_encode_chat_template`` calls it, with the template SGLang's template manager
selects (the first of several named ones: ``template_manager.py: _select_named_template``).

transformers imports an installed torch when it is imported (``keep_torch_out`` stops that in the router's
process) and is imported here only when the first tokenizer is built.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from sgl_moe.router.request.piece_cache import EncodeBatch, PieceCache
from sgl_moe.router.request.prefix_memo import MemoPath, PrefixMemo
from sgl_moe.router.request.token_cuts import CutRule
from sgl_moe.router.request.token_ids import TokenIds
from sgl_moe.wire import TOKENIZER_FILE_NAMES, is_tokenizer_file_name

try:
    from sgl_moe.router.request.native_bpe import Bpe
except ImportError:  # no C compiler at install: the library's model encodes new pieces
    Bpe = None
NATIVE_BPE = Bpe is not None
"""Whether new word pieces of a tokenizer without a pre-tokenizer can be encoded by the C BPE (``bpe_encoder``)."""

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("sgl_moe.router.tokenizer")

SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                            "mask_token")
"""transformers' named special tokens."""

LOAD_KWARGS: dict[str, Any] = dict(trust_remote_code=False, tokenizer_revision=None, clean_up_tokenization_spaces=False,
                                   use_fast=True, revision=None)
"""``get_tokenizer``'s ``common_kwargs`` for a worker started with SGLang's defaults (``--tokenizer-mode auto``,
no ``--trust-remote-code``, no ``--revision``)."""

V4_CLASSES_WITH_BOS_EOS_FLAGS = frozenset({"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                           "CodeLlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast",
                                           "CohereTokenizerFast"})
"""Classes whose ``add_bos_token`` / ``add_eos_token`` SGLang restores after loading (``_fix_v5_add_bos_eos_token``)."""

VOCABULARY_FILES = tuple(name for name in TOKENIZER_FILE_NAMES if name not in (
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "config.json", "chat_template.jinja",
    "chat_template.json"))
"""At least one must be there: without, transformers builds the model type's class with an empty vocabulary."""

STOCK_ENCODE_METHODS = ("__call__", "encode", "_encode_plus", "_convert_encoding")
"""A fast tokenizer that overrides none of these encodes exactly as its Rust backend's ``encode_batch``."""

SPECIALS_PROBES = ("a", "Hello world", "x\ny z", "<0>")
"""Texts whose ids with and without special tokens show what the post-processor adds around a text."""

PIECE_PROBES = ("a", " the", "  x", " 12345:", " naïve", " \u2581x", " \U0001f469\u200d\U0001f4bb", " \u0301",
                " \x00", " \ufffd", " zzqxj", "\u2581\u2581")
"""Pieces ``piece_encoder``'s encoder must give the batch encode's ids for before it is used."""


class NoChatTemplate(Exception):
    """The tokenizer has no chat template."""


class ChatTemplateError(Exception):
    """The chat template failed to render these messages (``raise_exception`` or a Jinja error)."""


def keep_torch_out() -> None:
    """Make this process's transformers load without torch; for the router's own process, before any import of it.

    transformers imports an installed torch with ``AutoTokenizer`` (``configuration_utils`` -> ``generation`` ->
    ``logits_process``): measured here 4.4 s and 700 MB, against 1.5 s and 80 MB without; tokenizers need none
    of it. A ``None`` entry in ``sys.modules`` makes ``importlib.util.find_spec("torch")`` answer None, which
    transformers reads as "torch is not installed" (``is_torch_available``), and makes ``import torch`` fail.
    """
    if "transformers" in sys.modules:
        log.warning("transformers is already imported; too late to keep torch out of this process")
        return
    sys.modules.setdefault("torch", None)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # its "PyTorch was not found" advice


def encode_batches_serially() -> None:
    """Make the tokenizers library encode a batch on the calling thread, for the router's own process.

    By default it spreads a batch over a thread pool (rayon). The router's batches are one request's texts or a
    text's new pieces (``piece_cache``): measured on the 2-core VM, 36 pieces cost 267 µs of CPU spread, 128 µs
    serially. The router's parallelism is across requests (parse threads, ``--front-processes``). A value the
    user set (``TOKENIZERS_PARALLELISM``) is kept; the library reads it at every call.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def freeze_what_loading_made() -> None:
    """Take the objects alive now out of the garbage collector's passes, for the router's own process, after it
    loads a tokenizer.

    The first load imports transformers: about 370,000 objects that every later full collection would walk (one
    full collection of them: 166 ms on the 2-core VM, all of it holding the GIL, so the event loop answers nothing
    meanwhile). ``tune_gc`` freezes what start-up made, but this import comes later. With its high thresholds a
    router serving 3,000 requests ran one full collection after start-up (48 ms, with this freeze), so this bounds
    a rare pause rather than saving CPU per request. Frozen objects are never collected as cycles: a load's few leftover
    cycles stay."""
    gc.freeze()


def load_like_sglang(directory: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer SGLang's ``get_tokenizer(directory)`` returns, for a worker with SGLang's default flags."""
    import transformers
    from transformers import AutoTokenizer

    name = str(directory)
    tokenizer = AutoTokenizer.from_pretrained(name, **LOAD_KWARGS)
    if type(tokenizer).__name__ == "TokenizersBackend":  # _resolve_tokenizers_backend
        slow = {**LOAD_KWARGS, "use_fast": False}
        tokenizer = AutoTokenizer.from_pretrained(name, **slow)
        if type(tokenizer).__name__ == "TokenizersBackend":  # _load_tokenizer_by_declared_class
            declared = _tokenizer_config(directory).get("tokenizer_class")
            cls = getattr(transformers, declared, None) if declared and declared not in (
                "PreTrainedTokenizer", "PreTrainedTokenizerBase") else None
            if cls is not None:
                try:
                    tokenizer = cls.from_pretrained(name, **slow)
                except (OSError, ValueError, TypeError, ImportError) as exc:
                    log.warning("loading %s as %s failed (%s); keeping AutoTokenizer's result", name, declared, exc)
    _restore_backend_components(tokenizer, Path(directory))
    _restore_bos_eos_flags(tokenizer, _tokenizer_config(directory))
    if getattr(tokenizer, "special_tokens_pattern", None) == "cls_sep" and (  # _fix_special_tokens_pattern
            tokenizer.cls_token_id is None or tokenizer.sep_token_id is None):
        tokenizer.special_tokens_pattern = "none"
    if isinstance(tokenizer.chat_template, dict) and tokenizer.chat_template:  # template_manager: first named one
        tokenizer.chat_template = next(iter(tokenizer.chat_template.values()))
    return tokenizer


def _tokenizer_config(directory: str | Path) -> dict[str, Any]:
    try:
        config = json.loads((Path(directory) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _restore_backend_components(tokenizer: Any, directory: Path) -> None:
    """SGLang's ``_fix_v5_tokenizer_components``: a class whose ``__init__`` rebuilt the pre-tokenizer (Llama's
    Metaspace over a ByteLevel ``tokenizer.json``) gets the file's pre-tokenizer and decoder back."""
    backend = getattr(tokenizer, "_tokenizer", None)
    path = directory / "tokenizer.json"
    if backend is None or not path.is_file():
        return
    from tokenizers import Tokenizer

    try:
        raw = Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises plain Exception on a bad file
        log.warning("cannot read %s to compare pre-tokenizers: %s", path, exc)
        return
    raw_pre = type(raw.pre_tokenizer).__name__ if raw.pre_tokenizer else None
    loaded_pre = type(backend.pre_tokenizer).__name__ if backend.pre_tokenizer else None
    if raw_pre and loaded_pre and raw_pre != loaded_pre:
        backend.pre_tokenizer, backend.decoder = raw.pre_tokenizer, raw.decoder


def _restore_bos_eos_flags(tokenizer: Any, config: dict[str, Any]) -> None:
    """SGLang's ``_fix_v5_add_bos_eos_token``: transformers 5 drops ``add_bos_token`` / ``add_eos_token`` when a
    ``tokenizer.json`` exists; SGLang restores them (v4 defaults: BOS on, EOS off; EOS never for a fast tokenizer)
    for the classes that had the flags in v4, and rebuilds the post-processor."""
    if config.get("tokenizer_class", "") not in V4_CLASSES_WITH_BOS_EOS_FLAGS:
        return
    from transformers import PreTrainedTokenizerFast

    changed = False
    for attr, default in (("add_bos_token", True), ("add_eos_token", False)):
        value = config.get(attr)
        if value is None or (attr == "add_eos_token" and isinstance(tokenizer, PreTrainedTokenizerFast)):
            value = default
        if getattr(tokenizer, attr, None) != value:
            setattr(tokenizer, f"_{attr}", value)  # the property reads the private attribute
            changed = True
    if changed and hasattr(tokenizer, "update_post_processor"):
        tokenizer.update_post_processor()


def _generic(directory: Path) -> PreTrainedTokenizerBase:
    """transformers' generic class over ``tokenizer.json``: the fallback when SGLang's way does not load here."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(directory), **LOAD_KWARGS)


class RouterTokenizer:
    """Encodes prompts to the ids an SGLang worker prefills; renders the model's chat template as the worker does."""

    def __init__(self, hf: PreTrainedTokenizerBase, exact: bool = True, inexact_reason: str = "") -> None:
        self.hf = hf
        """The transformers tokenizer, as SGLang's ``get_tokenizer`` returns it."""
        self.exact = exact
        """True while ``encode`` is trusted to equal the worker's ids; requests then carry prefix affinity.
        Hook for the pool: it calls ``mark_inexact`` when the worker's own ids disagree."""
        self.inexact_reason = inexact_reason
        self.special_tokens: dict[str, str] = {
            attr: value for attr in SPECIAL_TOKEN_ATTRIBUTES if isinstance(value := getattr(hf, attr, None), str)}
        """Named special tokens (``bos_token``, ...) as strings."""
        self.backend = getattr(hf, "backend_tokenizer", None) if getattr(hf, "is_fast", False) else None
        """The Rust ``tokenizers.Tokenizer`` of a fast tokenizer (None for a slow one)."""
        self._stock = self.backend is not None and _stock_encoding(hf)
        if self._stock:  # what every stock __call__ sets before encoding (set_truncation_and_padding)
            self.backend.no_truncation()
            self.backend.no_padding()
            self.backend.encode_special_tokens = bool(getattr(hf, "split_special_tokens", False))
        self.memo: PrefixMemo | None = None
        """Ids of prefixes seen before (``prefix_memo``), special tokens added; None when this tokenizer's texts
        are encoded whole."""
        self.plain_memo: PrefixMemo | None = None
        """The same for ``encode_plain`` (rendered chat prompts, decisions, classify's tasks)."""
        self.pieces: PieceCache | None = None
        """Ids of words seen before (``piece_cache``), through which the memos encode; None where texts cannot be
        cut at spaces (regex-piece tokenizers) or there is no memo."""
        self.memo_off_reason = "a tokenizer that is not a stock fast tokenizer" if not self._stock else ""
        if self._stock:
            self.memo, self.plain_memo, self.memo_off_reason = self._prefix_memos()
        log.info("prefix memo %s", f"on ({self.memo.rule.family} cuts, "
                 f"{'words encoded once' if self.pieces else 'new text encoded whole'})" if self.memo else
                 f"off: {self.memo_off_reason}; every text is encoded whole")

    def drop_memo(self, reason: str) -> None:
        """Encode every text whole from now on."""
        self.memo = self.plain_memo = None
        self.memo_off_reason = reason
        log.info("prefix memo off: %s", reason)

    def _prefix_memos(self) -> tuple[PrefixMemo | None, PrefixMemo | None, str]:
        rule, why = CutRule.of(self.backend)
        if rule is None:
            return None, None, why
        specials = _added_around(self._encode_plain_batch, self._encode_full_batch)
        if specials is None:
            return None, None, "the special tokens added around a text depend on the text"
        self.pieces = PieceCache.of(rule, self._encode_plain_batch,
                                    piece_encoder(self.backend, self._encode_plain_batch))
        by_piece = self.pieces.encode_batch if self.pieces is not None else self._encode_plain_batch
        return (PrefixMemo(rule, by_piece, self._encode_full_batch, *specials),
                PrefixMemo(rule, by_piece, self._encode_plain_batch, [], []), "")

    def _encode_plain_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]

    def _encode_full_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=True)]

    @classmethod
    def from_dir(cls, directory: str | Path) -> RouterTokenizer:
        """Load as SGLang does; if that fails (remote code, a class this transformers lacks), transformers'
        generic class over ``tokenizer.json``, not exact."""
        if not any((Path(directory) / name).is_file() for name in VOCABULARY_FILES):
            raise ValueError(f"no vocabulary file (any of {', '.join(VOCABULARY_FILES)})")
        try:
            return cls(load_like_sglang(directory))
        except Exception as exc:  # whatever transformers or a tokenizer class raises on files it cannot load
            reason = f"SGLang's loader failed here ({type(exc).__name__}: {exc}); generic tokenizer.json loader"
            hf = _generic(Path(directory))
        log.warning("%s: %s", directory, reason)
        return cls(hf, exact=False, inexact_reason=reason)

    @classmethod
    def from_file_bytes(cls, files: Mapping[str, bytes]) -> RouterTokenizer:
        """Load from the files a worker serves (name -> bytes), written to a private temporary directory."""
        with tempfile.TemporaryDirectory(prefix="sgl_moe-tokenizer-") as tmp:
            for name, data in files.items():
                if not is_tokenizer_file_name(name):
                    raise ValueError(f"{name!r} is not a tokenizer file name the router accepts")
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            return cls.from_dir(tmp)

    @classmethod
    def from_files(cls, tokenizer_json: bytes, tokenizer_config: dict | None = None) -> RouterTokenizer:
        """Load from ``tokenizer.json`` and the parsed ``tokenizer_config.json`` alone."""
        files = {"tokenizer.json": tokenizer_json}
        if tokenizer_config is not None:
            files["tokenizer_config.json"] = json.dumps(tokenizer_config).encode()
        return cls.from_file_bytes(files)

    def mark_inexact(self, reason: str) -> None:
        """Stop trusting ``encode`` (requests lose prefix affinity; ``/v1/classify`` sends text to ``/v1/score``)."""
        self.exact, self.inexact_reason = False, reason
        log.warning("router tokenizer no longer exact: %s", reason)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The ids SGLang prefills for each text sent to ``/generate`` (special tokens added), as lists."""
        return [ids.tolist() if type(ids) is TokenIds else ids for ids in self.encode_with_paths(texts)[0]]

    def encode_with_paths(self, texts: list[str]) -> tuple[list[list[int]], list[MemoPath]]:
        """``encode_batch``, and for each text the memo path its ids came through (for ``memo.page_hashes``;
        empty without the memo). Ids the memo assembled are ``TokenIds`` (packed uint32, equal to the list of the
        same ints): the request path hashes and writes them from their buffer."""
        if not texts:
            return [], []
        if self.memo is not None and self.memo.enabled:
            return self.memo.encode_batch(texts)
        if self._stock:  # the Rust call tokenizer(texts) makes, without a BatchEncoding or character offsets
            ids = self._encode_full_batch(texts)
        elif self.backend is not None:
            ids = self.hf(texts)["input_ids"]
        else:
            ids = [self.hf.encode(t) for t in texts]
        return ids, [() for _ in texts]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_plain(self, text: str) -> list[int]:
        """The ids of ``text`` with no special tokens added (rendered chat prompts, score items)."""
        if self.plain_memo is not None and self.plain_memo.enabled:
            ids = self.plain_memo.encode_batch([text])[0][0]
            return ids.tolist() if type(ids) is TokenIds else ids
        if self._stock:
            return self.backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` (classify's label prefixes, written back as text when the router is not exact)."""
        return self.hf.decode(ids)

    @cached_property
    def max_token_chars(self) -> int:
        """Characters of the vocabulary's longest token (byte-level tokens spell one character per byte, so this
        bounds the characters one token can cover); 0 when the vocabulary cannot be listed."""
        try:
            return max((len(t) for t in self.hf.get_vocab()), default=0)
        except Exception:  # a tokenizer class without get_vocab: no bound
            return 0

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.hf, "chat_template", None)
        return template if isinstance(template, str) else None

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kw: Any) -> str:
        """The chat prompt as text, as SGLang renders it (``kw``: ``tools`` and ``chat_template_kwargs`` entries).

        Raises NoChatTemplate or ChatTemplateError."""
        if self.chat_template is None:
            raise NoChatTemplate("this model's tokenizer has no chat template")
        tools = kw.pop("tools", None)
        try:
            return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                               tools=tools, return_dict=False, **kw)
        except (jinja2.TemplateError, TypeError, ValueError) as e:
            raise ChatTemplateError(str(e)) from e


def piece_encoder(backend: Any, encode_plain: EncodeBatch) -> EncodeBatch | None:
    """For the piece cache: the ids of pieces (texts holding no added token's content) from the library's own
    normalizer, pre-tokenizer and model, called one after the other as its encode calls them; None where that
    could differ from ``encode_plain`` (``backend``'s batch encode without special tokens).

    What the encode does besides: it first splits out added tokens (a piece holds none of those that match the raw
    text; none may match the normalized text: ``normalized`` added tokens decline), and it runs the post-processor,
    which adds nothing without special tokens and moves only offsets (so it is skipped); the model is BPE without
    dropout (its ids could differ call to call). The encode's Encoding, offsets and batch are what this saves: about
    8 us for one new piece, 2 us a piece in a batch of 36, on the 2-core VM. A normalizer that only replaces
    single characters (``char_replacements``: the shipped model's ``" "`` -> ``"▁"``) is run as ``str.replace``
    (0.1 us where the library's call is 0.8: a new piece then costs 1.55 us, not 2.5). ``PIECE_PROBES`` must agree
    (the replacement with the normalizer, the encoder with the batch encode) before either is used; the prefix
    memo's sampled whole-encode check keeps comparing in service."""
    from tokenizers import models

    model = backend.model
    if not isinstance(model, models.BPE) or model.dropout:
        return None
    added = list(backend.get_added_tokens_decoder().values())
    if any(token.normalized for token in added):
        return None
    normalize = backend.normalizer.normalize_str if backend.normalizer is not None else None
    spec = json.loads(backend.to_str())  # read once: a 150k vocabulary's JSON takes about 0.5 s to parse
    replaced = char_replacements(spec.get("normalizer"))
    if replaced:  # the same characters replaced without the library's call (a seventh of its cost per piece)
        replace = _replacing(replaced)
        if all(replace(p) == normalize(p) for p in PIECE_PROBES):
            normalize = replace
    pre_tokenize = backend.pre_tokenizer.pre_tokenize_str if backend.pre_tokenizer is not None else None
    tokenize = model.tokenize
    bpe = None
    if pre_tokenize is None and (normalize is None or replaced and normalize is replace):
        bpe = bpe_encoder(spec.get("model") or {}, replaced if normalize is not None else [])

    def encode_native(pieces: list[str]) -> list[list[int]]:
        out = bpe.encode(pieces)
        if None in out:  # a piece of more symbols than the C loop takes
            for i, ids in enumerate(out):
                if ids is None:
                    out[i] = [t.id for t in tokenize(normalize(pieces[i]) if normalize is not None else pieces[i])]
        return out

    def encode(pieces: list[str]) -> list[list[int]]:
        if pre_tokenize is None:  # sentencepiece models as transformers converts them: the model sees the piece
            if normalize is None:
                return [[t.id for t in tokenize(piece)] for piece in pieces]
            return [[t.id for t in tokenize(normalize(piece))] for piece in pieces]
        out = []
        for piece in pieces:
            text = normalize(piece) if normalize is not None else piece
            out.append([t.id for part, _ in pre_tokenize(text) for t in tokenize(part)])
        return out

    probes = [p for p in PIECE_PROBES if not any(t.content and t.content in p for t in added)]
    expected = encode_plain(probes)
    if encode(probes) != expected:
        log.warning("piece encoder off: the tokenizer's model gives other ids than its encode for a probe piece")
        return None
    if bpe is not None:
        if encode_native(probes) == expected:
            return encode_native
        log.warning("native BPE off: its ids differ from the tokenizer's for a probe piece (the library encodes "
                    "new pieces)")
    return encode


def bpe_encoder(spec: dict[str, Any], replacements: list[tuple[str, str]]) -> Any:
    """``native_bpe.Bpe`` for the model ``spec`` (``tokenizer.json``'s ``"model"``; ``replacements``: the
    normalizer's, as ``char_replacements`` reads them), or None where it could differ from the library's: not BPE,
    dropout, a subword prefix or suffix, ``ignore_merges``, an unknown token outside the vocabulary, a merge that is
    not two vocabulary tokens whose concatenation is one, or the extension not built."""
    if Bpe is None:
        return None
    vocab = spec.get("vocab")
    if spec.get("type") != "BPE" or not isinstance(vocab, dict) or spec.get("dropout") \
            or spec.get("continuing_subword_prefix") or spec.get("end_of_word_suffix") or spec.get("ignore_merges"):
        return None
    unk = spec.get("unk_token")
    if unk is not None and unk not in vocab:
        return None
    merges = []
    for merge in spec.get("merges") or []:
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if len(pair) != 2 or pair[0] not in vocab or pair[1] not in vocab or pair[0] + pair[1] not in vocab:
            return None
        merges.append((vocab[pair[0]], vocab[pair[1]], vocab[pair[0] + pair[1]]))
    byte_ids = [vocab.get(f"<0x{b:02X}>", -1) for b in range(256)] if spec.get("byte_fallback") else None
    try:
        return Bpe({ord(t): i for t, i in vocab.items() if len(t) == 1}, byte_ids,
                   vocab[unk] if unk is not None else -1, bool(spec.get("fuse_unk")), merges,
                   [(ord(a), ord(b)) for a, b in replacements])
    except (TypeError, ValueError, OverflowError):
        return None


def char_replacements(spec: dict[str, Any] | None) -> list[tuple[str, str]] | None:
    """(pattern, content) of a normalizer (``spec``: ``tokenizer.json``'s ``"normalizer"``) that only replaces single
    characters by single characters (one ``Replace`` of a one-character string, or a ``Sequence`` of them), where no
    content is another replacement's pattern (so replacing them in order and all at once agree); None for any other
    normalizer or none."""
    if not spec:
        return None
    steps = spec.get("normalizers") if spec.get("type") == "Sequence" else [spec]
    pairs = []
    for n in steps or []:
        pattern, content = (n.get("pattern") or {}).get("String"), n.get("content")
        if n.get("type") != "Replace" or not isinstance(pattern, str) or not isinstance(content, str) \
                or len(pattern) != 1 or len(content) != 1:
            return None
        pairs.append((pattern, content))
    patterns = {a for a, _ in pairs}
    if not pairs or len(patterns) != len(pairs) or any(b in patterns for _, b in pairs):
        return None
    return pairs


def _replacing(pairs: list[tuple[str, str]]) -> Callable[[str], str]:
    """``str.replace`` of each pair in turn (``char_replacements``: in turn and at once agree)."""
    if len(pairs) == 1:
        [(a, b)] = pairs

        def normalize(text: str) -> str:
            return text.replace(a, b)
        return normalize
    table = str.maketrans(dict(pairs))

    def normalize_all(text: str) -> str:
        return text.translate(table)
    return normalize_all


def _added_around(plain: Any, full: Any) -> tuple[list[int], list[int]] | None:
    """The ids a tokenizer adds before and after every text's own (``SPECIALS_PROBES``); None if they vary."""
    found = set()
    for own, whole in zip(plain(list(SPECIALS_PROBES)), full(list(SPECIALS_PROBES))):
        at = next((i for i in range(len(whole) - len(own) + 1) if whole[i:i + len(own)] == own), None)
        if not own or at is None:
            return None
        found.add((tuple(whole[:at]), tuple(whole[at + len(own):])))
    if len(found) != 1:
        return None
    before, after = found.pop()
    return list(before), list(after)


def _stock_encoding(hf: Any) -> bool:
    from transformers import TokenizersBackend

    cls = type(hf)
    return isinstance(hf, TokenizersBackend) and all(
        getattr(cls, m, None) is getattr(TokenizersBackend, m, None) for m in STOCK_ENCODE_METHODS)
