"""The C BPE (``native_bpe``) gives the tokenizers library's ids for every piece it takes, on every fixture tokenizer
it serves and on variants of the shipped model's that exercise each rule (no byte fallback, unknown tokens fused or
not, no unknown token, a merge listed twice); models it cannot match exactly are declined."""

import json
import random
import re

import pytest
from tokenizers import Tokenizer

from sgl_moe.router.request import router_tokenizer

from . import test_prefix_memo
from .test_prefix_memo import random_text

tokenizers = test_prefix_memo.tokenizers
variants_root = test_prefix_memo.variants_root

native = pytest.importorskip("sgl_moe.router.request.native_bpe", reason="the C extension was not built")

ODD = ["😀", "👍🏽", "👨\u200d👩\u200d👧", "e\u0301", "中文", "\u0000", "\x7f", "\U0010ffff", "\ufffd", "▁", "▁▁▁",
       "\t", "\n", "  ", "ǅ", "ß", "\u2028", "<0x41>", "<unk>"]
"""Characters the shipped vocabulary lacks (byte fallback or unknown), ``▁`` as text, byte tokens written as text."""


def _pieces(seed: str, count: int = 400) -> list[str]:
    rng = random.Random(seed)
    pieces = {p for _ in range(count) for p in re.findall(r" *[^ ]+| +", random_text(rng, rng.randint(1, 30)))}
    pieces |= {"".join(rng.choice(ODD) for _ in range(rng.randint(1, 6))) for _ in range(count)}
    pieces |= {" " + "".join(rng.choice("abcxyz0123456789") for _ in range(rng.randint(1, 12))) for _ in range(count)}
    pieces |= {" " + "x" * 300, "😀" * 80, " " * 300}  # more symbols than the C loop takes: the library's
    return sorted(pieces)


def _library(backend, pieces: list[str]) -> list[list[int]]:
    """The library's own model on each normalized piece (what ``piece_encoder`` compares with the batch encode)."""
    normalize = backend.normalizer.normalize_str if backend.normalizer is not None else (lambda p: p)
    return [[t.id for t in backend.model.tokenize(normalize(p))] for p in pieces]


def _variant(backend, **model) -> Tokenizer:
    spec = json.loads(backend.to_str())
    spec["model"].update(model)
    return Tokenizer.from_str(json.dumps(spec))


def _agrees(backend) -> int:
    """Asserts ``Bpe.encode`` equals the library on ``_pieces`` where it takes them; returns how many it declined."""
    spec = json.loads(backend.to_str())
    bpe = router_tokenizer.bpe_encoder(spec["model"], router_tokenizer.char_replacements(spec.get("normalizer")) or [])
    assert bpe is not None
    pieces = _pieces(backend.to_str()[:64])
    got, want = bpe.encode(pieces), _library(backend, pieces)
    declined = [p for p, g in zip(pieces, got) if g is None]
    assert all(len(p) > 60 for p in declined)
    assert [g for g in got if g is not None] == [w for g, w in zip(got, want) if g is not None]
    return len(declined)


def test_the_shipped_model_and_its_variants_agree_with_the_library(tokenizers):
    shipped = tokenizers("shipped").backend
    assert _agrees(shipped) == 3
    spec = json.loads(shipped.to_str())["model"]
    merges = spec["merges"]
    variants = [
        _variant(shipped, byte_fallback=False),  # unknown characters: the unknown token, fused
        _variant(shipped, byte_fallback=False, fuse_unk=False),  # one unknown token each
        _variant(shipped, byte_fallback=False, unk_token=None),  # no unknown token: the character gives nothing
        _variant(shipped, merges=merges + merges[:50]),  # listed again: the later rank counts
        _variant(shipped, merges=list(reversed(merges))),  # another order of the same merges
    ]
    for backend in variants:
        _agrees(backend)


def test_the_llama_fixtures_model_agrees_with_the_library(tokenizers):
    """Another model (byte fallback, no unknown token, no normalizer): the C encoder on the model alone."""
    assert _agrees(tokenizers("llama").backend) == 3


def test_piece_encoder_uses_it_where_the_model_sees_the_piece(tokenizers):
    """Tokenizers without a pre-tokenizer (the shipped model and the fixtures made from it) get the C encoder
    through ``piece_encoder``, whose ids equal the batch encode's on random pieces; a pre-tokenizer (Llama's
    ``Metaspace``) keeps the library's encoder."""
    for name in ("shipped", "split-specials"):
        backend = tokenizers(name).backend
        encode = router_tokenizer.piece_encoder(backend, lambda texts, b=backend: _plain(b, texts))
        assert encode is not None and encode.__name__ == "encode_native", name
        added = [t.content for t in backend.get_added_tokens_decoder().values() if t.content]
        pieces = [p for p in _pieces(name) if not any(a in p for a in added)]
        assert encode(pieces) == _plain(backend, pieces)
    llama = tokenizers("llama").backend
    assert router_tokenizer.piece_encoder(llama, lambda texts: _plain(llama, texts)).__name__ == "encode"


def _plain(backend, texts):
    return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]


def _model(backend, **change):
    """``backend``'s model as ``bpe_encoder`` reads it (``tokenizer.json``'s ``"model"``) with ``change`` made: the
    library refuses to load some of these (a merge outside the vocabulary) or aborts on them."""
    return {**json.loads(backend.to_str())["model"], **change}


@pytest.mark.parametrize("change", [
    {"ignore_merges": True}, {"dropout": 0.5}, {"continuing_subword_prefix": "##"}, {"end_of_word_suffix": "</w>"},
    {"unk_token": "<nowhere>"}, {"type": "WordPiece"}, {"merges": [["▁", "not-a-token"]]},
    {"merges": [["▁", "t", "h"]]}, {"merges": ["▁ t h"]},
])
def test_models_it_cannot_match_are_declined(tokenizers, change):
    shipped = tokenizers("shipped").backend
    assert router_tokenizer.bpe_encoder(_model(shipped), [(" ", "▁")]) is not None
    assert router_tokenizer.bpe_encoder(_model(shipped, **change), [(" ", "▁")]) is None


def test_a_lone_surrogate_raises_as_the_library_does(tokenizers):
    bpe = router_tokenizer.bpe_encoder(_model(tokenizers("shipped").backend), [(" ", "\u2581")])
    with pytest.raises(UnicodeEncodeError):
        bpe.encode([" ok", "a\ud800b"])
