"""Segments: the text of a key is deterministic, distinct per key and exactly ``tokens`` tokens long."""

import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from sgl_moe.workloads import Segment, literal, segment_text, segment_token_ids
from sgl_moe.workloads.segments import TOKENIZER_PATH, new_segment, vocabulary


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER_PATH))


def test_the_tokenizer_adds_no_special_tokens(tokenizer):
    # no post-processor: add_special_tokens=True (what SGLang uses) adds no BOS/EOS to a prompt
    assert tokenizer.encode("", add_special_tokens=True).ids == []
    plain = tokenizer.encode(" the", add_special_tokens=False).ids
    assert tokenizer.encode(" the", add_special_tokens=True).ids == plain
    assert len(tokenizer.encode(" the", add_special_tokens=True).ids) == 1


@pytest.mark.parametrize("tokens", [1, 2, 3, 16, 31, 100, 1000, 3900])
def test_generated_segment_has_exact_tokens(tokenizer, tokens):
    for n in range(5):
        seg = Segment(f"test/{tokens}/{n}", tokens)
        ids = tokenizer.encode(segment_text(seg), add_special_tokens=True).ids
        assert len(ids) == tokens
        assert ids == segment_token_ids(seg)


def test_literal_segments_measure_their_tokens(tokenizer):
    for text in ["\nAnswer:", "\nA.", "\nQuestion:", "\nDoes the candidate apply? Answer:"]:
        seg = literal(text)
        assert seg.key == text and segment_text(seg) == text
        assert segment_token_ids(seg) == tokenizer.encode(text, add_special_tokens=True).ids
        assert seg.tokens == len(segment_token_ids(seg))


@pytest.mark.parametrize("text", ["Answer:", "\nA. ", " x"])
def test_literals_must_start_with_newline_and_not_end_with_space(text):
    with pytest.raises(ValueError):
        literal(text)


def test_same_key_same_text_across_processes():
    # keys are hashed with blake2b, not the per-process salted hash()
    key = Segment("stable/key", 12)
    code = ("from sgl_moe.workloads import Segment, segment_text\n"
            "print(segment_text(Segment('stable/key', 12)))")
    texts = set()
    for salt in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": salt})
        texts.add(out.stdout.rstrip("\n"))
    assert texts == {segment_text(key)}


def test_different_keys_give_different_text():
    texts = {segment_text(Segment(f"distinct/{n}", 4)) for n in range(3000)}
    assert len(texts) == 3000


def test_sibling_keys_always_differ_even_at_one_token():
    for base in range(200):
        texts = [segment_text(Segment(f"req/{base}/answer#{j}", 1)) for j in range(26)]
        assert len(set(texts)) == 26


def test_longer_segment_of_a_key_extends_the_shorter():
    short, long = segment_text(Segment("grow", 10)), segment_text(Segment("grow", 40))
    assert long.startswith(short) and long != short


def test_fast_constructor_builds_an_equal_segment():
    a, b = new_segment("k", 7), Segment("k", 7)
    assert a == b and hash(a) == hash(b) and a.tokens == 7
    with pytest.raises(AttributeError):
        a.tokens = 3  # still frozen


def test_words_are_single_tokens(tokenizer):
    vocab = vocabulary()
    sample = vocab.words[::7]
    encoded = tokenizer.encode_batch([" " + w for w in sample], add_special_tokens=True)
    assert all(len(e.ids) == 1 for e in encoded)
    assert len(vocab.words) > 500
