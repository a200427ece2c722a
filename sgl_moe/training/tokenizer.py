"""Train the shipped model's tokenizer with sentencepiece and export it for HF / SGLang.

SentencePiece BPE with byte fallback, trained on the stdlib corpus with whitespace kept as is
(indentation matters in code). It is exported as a ``tokenizers`` BPE model (``tokenizer.json``)
with the same vocabulary and merge order, so SGLang, HF transformers and the router (which needs no
torch and no sentencepiece at run time) all load one file. ``tokenizer.model`` ships beside it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIAL_TOKENS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}


def train_sentencepiece(docs: list[str], out_prefix: Path, vocab_size: int, seed: int,
                        max_sentences: int = 400_000) -> Path:
    """Train a BPE model on the corpus lines; returns the ``.model`` path."""
    import sentencepiece as spm

    lines = [line for doc in docs for line in doc.splitlines() if line.strip()]
    random.Random(seed).shuffle(lines)
    lines = lines[:max_sentences]
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(out_prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        unk_piece=SPECIAL_TOKENS["unk"], bos_piece=SPECIAL_TOKENS["bos"],
        eos_piece=SPECIAL_TOKENS["eos"], pad_piece=SPECIAL_TOKENS["pad"],
        user_defined_symbols=["\t"],
        max_sentence_length=8192,
        num_threads=2,
        minloglevel=2,
    )
    return out_prefix.with_suffix(".model")


def _merges_from_vocab(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Recover BPE merges from a sentencepiece BPE vocabulary.

    SentencePiece numbers BPE pieces in merge order, so a piece's id ranks the merge that made it;
    every split of a piece into two in-vocabulary halves is a candidate merge of that rank.
    """
    ranked: list[tuple[int, int, tuple[str, str]]] = []
    for piece, pid in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((pid, vocab[left] + vocab[right], (left, right)))
    ranked.sort()
    return [pair for _, _, pair in ranked]


def export_hf_tokenizer(sp_model: Path, out_dir: Path) -> None:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` equivalent to the sentencepiece model."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    mergeable = {p: i for p, i in vocab.items()
                 if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or p == "\t")}
    tok = Tokenizer(BPE(vocab=vocab, merges=_merges_from_vocab(mergeable), unk_token=SPECIAL_TOKENS["unk"],
                        byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS.values()])
    tok.add_tokens([AddedToken("\t", special=False, normalized=False)])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": SPECIAL_TOKENS["bos"],
        "eos_token": SPECIAL_TOKENS["eos"],
        "unk_token": SPECIAL_TOKENS["unk"],
        "pad_token": SPECIAL_TOKENS["pad"],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {k + "_token": v for k, v in SPECIAL_TOKENS.items()}, indent=2) + "\n")
