"""The piece cache gives exactly the ids of a whole encode, for every fixture tokenizer it serves.

Texts are made of ``test_prefix_memo``'s atoms (whitespace runs, ``▁`` written as text, special and added tokens as
text, tabs, combining sequences, ZWJ emoji, non-ASCII words): encoded cold, warm, in batches, with pieces dropped
while texts are encoded, the ids equal the tokenizer's own.
"""

import json
import random
import re

import pytest

from sgl_moe.router.request import piece_cache, router_tokenizer, word_pieces

from . import test_prefix_memo
from .test_prefix_memo import TOKENIZERS, full, plain, random_text

tokenizers = test_prefix_memo.tokenizers  # the fixtures: every fixture tokenizer, loaded once per module
variants_root = test_prefix_memo.variants_root


@pytest.fixture(params=["native", "python"])
def table(request, monkeypatch):
    """Which ``PieceTable`` the caches made in a test use: the C one (where it was built) or the reference."""
    if request.param == "native" and not word_pieces.NATIVE:
        pytest.skip("the C extension was not built")
    if request.param == "python":
        monkeypatch.setattr(word_pieces, "native_word_pieces", None)
    return request.param


@pytest.fixture(params=["batch encode", "piece encoder"])
def new_pieces(request):
    """Makes the caches of a test; they encode new pieces with the batch encode or with ``piece_encoder`` (skipped
    where the tokenizer has none)."""
    def make(tok):
        encode_new = None
        if request.param == "piece encoder":
            encode_new = router_tokenizer.piece_encoder(tok.backend, tok._encode_plain_batch)
            if encode_new is None:
                pytest.skip("this tokenizer has no piece encoder")
        return piece_cache.PieceCache.of(tok.memo.rule, tok._encode_plain_batch, encode_new)
    return make


def _texts(rng: random.Random, n: int) -> list[str]:
    return [random_text(rng, rng.randint(1, 60)) for _ in range(n)] + [
        "\n".join(random_text(rng, 6) for _ in range(5)) for _ in range(n // 4)]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_piece_ids_equal_a_whole_encode(name, tokenizers, table, new_pieces):
    tok = tokenizers(name)
    if tok.pieces is None:
        pytest.skip(f"{name}: no piece cache ({tok.memo_off_reason or 'texts are not cut at spaces'})")
    cache = new_pieces(tok)
    rng = random.Random(f"pieces-{name}")
    texts = _texts(rng, 200)
    for _ in range(2):  # cold, then warm
        for i in range(0, len(texts), 7):
            batch = texts[i:i + rng.randint(1, 7)]
            assert cache.encode_batch(batch) == plain(tok, batch), (name, batch)
    assert cache.hits > cache.misses > 0
    assert cache.whole < len(texts), f"{name}: every text was encoded whole"


def test_the_shipped_tokenizer_cuts_at_spaces_and_byte_level_ones_do_not(tokenizers):
    shipped, qwen = tokenizers("shipped"), tokenizers("qwen")
    assert shipped.pieces is not None and qwen.pieces is None
    cache = shipped.pieces
    assert cache.cuttable("Classify the text below.\n  Input: it was fine, 42 times")
    for text in ("a▁ b", "x <s> y", "tab\there", "</s>"):  # BPE may merge the pair; an added token as text
        assert not cache.cuttable(text), text
        assert cache.encode_batch([text]) == plain(shipped, [text])


def test_dropping_pieces_while_encoding_changes_no_id(tokenizers, monkeypatch, table, new_pieces):
    tok = tokenizers("shipped")
    monkeypatch.setattr(piece_cache, "MAX_PIECES", 50)
    cache = new_pieces(tok)
    rng = random.Random("evict")
    texts = _texts(rng, 120)
    dropped = False
    for i in range(0, len(texts), 3):
        batch = texts[i:i + 3]
        before = len(cache._table)
        assert cache.encode_batch(batch) == plain(tok, batch)
        dropped |= len(cache._table) < before
    assert dropped and cache.misses > 50


def test_the_router_tokenizer_encodes_through_pieces_exactly(tokenizers):
    tok = tokenizers("shipped")
    rng = random.Random("router")
    prefix = "\n".join(random_text(rng, 20) for _ in range(12))
    texts = [prefix + random_text(rng, rng.randint(1, 30)) for _ in range(40)] + _texts(rng, 40)
    before = tok.pieces.hits
    assert tok.encode_batch(texts) == full(tok, texts)
    assert tok.pieces.hits > before


@pytest.mark.parametrize("name", TOKENIZERS)
def test_texts_split_by_words_and_by_the_regex_get_the_same_ids(name, tokenizers, table, new_pieces):
    """A text without two spaces in a row is split with ``str.split`` into words, its pieces kept by the word; one
    with them by the regex. The same words in both kinds of text, at the start, after a space, at the end, alone,
    with a space before or after the whole text: every text's ids equal a whole encode, cold and warm."""
    tok = tokenizers(name)
    if tok.pieces is None:
        pytest.skip(f"{name}: no piece cache ({tok.memo_off_reason or 'texts are not cut at spaces'})")
    cache = new_pieces(tok)
    rng = random.Random(f"split-{name}")
    words = ["the", "cat", "Hello", "world,", "42", "naïve", "x", "café.", "def", "(a)", "\n", "e\u0301", "🙂"]
    texts = ["", " ", "  ", "cat", " cat", "cat ", " cat ", "the  cat", "the cat  ", "  the cat", "the\ncat dog"]
    for _ in range(150):
        line = [rng.choice(words) for _ in range(rng.randint(1, 12))]
        text = " ".join(line)
        texts += [text, " " + text, text + " ", text.replace(" ", "  ", 1), rng.choice(words) + text]
    for _ in range(2):  # cold, then warm: the second round finds each piece under the other split's key too
        for i in range(0, len(texts), 9):
            batch = texts[i:i + 9]
            assert cache.encode_batch(batch) == plain(tok, batch), (name, batch)
    fast = [t for t in texts if cache.cuttable(t) and "  " not in t]
    slow = [t for t in texts if cache.cuttable(t) and "  " in t]
    assert len(fast) > 300 and len(slow) > 100, (len(fast), len(slow))
    assert len(cache._table) > 5 and cache.hits > cache.misses


def test_space_runs_give_the_regex_pieces():
    """``_space_runs`` over ``str.split(" ")`` gives the pieces ``" *[^ ]+| +"`` finds: every run of spaces, at the
    start, inside and at the end of a text, of every length up to 5."""
    import re

    rng = random.Random("runs")
    texts = ["", " ", "  ", "   ", "a", " a", "  a", "a ", "a  ", "a  b", "  a  b  ", "a b c"]
    texts += ["".join(rng.choice(["a", "bc", "\n", " ", "  ", "   ", " " * 5]) for _ in range(rng.randint(1, 14)))
              for _ in range(2000)]
    for text in texts:
        parts = text.split(" ")
        runs = word_pieces._space_runs(parts)
        pieces = [parts[0]] if parts[0] else []
        for j in range(1, len(parts)):
            run = runs.get(j)
            if run is None:
                pieces.append(" " + parts[j])
            elif run:
                pieces.append(run)
        assert pieces == re.findall(r" *[^ ]+| +", text), repr(text)


def test_long_texts_are_cut_into_runs_that_end_where_a_piece_ends(monkeypatch):
    """``_runs`` cuts a long text before a space that follows a non-space: the runs join to the text, every run
    but the last is at least ``CHUNK_CHARS`` long, and the runs' pieces, in order, are the text's."""
    import re

    monkeypatch.setattr(piece_cache, "CHUNK_CHARS", 6)
    rng = random.Random("long-runs")
    texts = ["a" * 40, " " * 40, "a" + " " * 30 + "b", "abcdef ghijkl", "abcdefg", "abcdef   "]
    atoms = ["a", "bc", "\n", " ", "  ", "   ", " " * 9, "x" * 9]
    texts += ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 30))) for _ in range(3000)]
    cut = 0
    for text in texts:
        runs = piece_cache._runs(text)
        assert "".join(runs) == text, repr(text)
        assert all(len(r) >= 6 for r in runs[:-1]), (text, runs)
        pieces = [p for r in runs for p in re.findall(r" *[^ ]+| +", r)]
        assert pieces == re.findall(r" *[^ ]+| +", text), (text, runs)
        cut += len(runs) > 1
    assert cut > 1000


@pytest.mark.parametrize("name", TOKENIZERS)
def test_long_texts_checked_and_encoded_run_by_run_get_a_whole_encodes_ids(name, tokenizers, monkeypatch, new_pieces):
    """With runs of a few characters, an added token or a mergeable pair across a run's end is still seen (the
    check by runs equals the check over the whole text) and every text's ids equal a whole encode, cold and warm."""
    tok = tokenizers(name)
    if tok.pieces is None:
        pytest.skip(f"{name}: no piece cache ({tok.memo_off_reason or 'texts are not cut at spaces'})")
    cache = new_pieces(tok)
    rng = random.Random(f"long-{name}")
    texts = [random_text(rng, rng.randint(20, 80)) for _ in range(150)]
    texts += [" ".join(random_text(rng, 3) for _ in range(10)) for _ in range(50)]
    whole_check = [cache.cuttable(t) for t in texts]
    monkeypatch.setattr(piece_cache, "CHUNK_CHARS", 7)
    assert [cache.cuttable(t) for t in texts] == whole_check
    assert 20 < sum(whole_check) < len(texts), sum(whole_check)
    for _ in range(2):
        for i in range(0, len(texts), 5):
            batch = texts[i:i + 5]
            assert cache.encode_batch(batch) == plain(tok, batch), (name, batch)


def test_a_text_without_utf8_is_encoded_whole(table):
    """A lone surrogate (no UTF-8: the C table cannot read the text) sends its text to a whole encode; the other
    texts of the batch are still cut. The encoder is a stand-in that tells the two apart: one id, the length."""
    cache = piece_cache.PieceCache(lambda texts: [[len(t)] for t in texts], "", [], False, None)
    assert cache.encode_batch(["a \ud800 b", "a bc"]) == [[5] if table == "native" else [1, 2, 2], [1, 3]]
    assert cache.whole == (1 if table == "native" else 0)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_piece_encoder_gives_the_batch_encodes_ids(name, tokenizers):
    """Every piece of random texts (words, numbers, combining sequences, ZWJ emoji, whitespace runs, ``▁`` as text,
    broken added tokens) that holds no added token: ``piece_encoder``'s ids equal the batch encode's, for every
    fixture tokenizer that has one (the byte-level ones too, which run a pre-tokenizer, though their memo does not
    use it). The shipped tokenizer has one."""
    tok = tokenizers(name)
    encode = router_tokenizer.piece_encoder(tok.backend, tok._encode_plain_batch)
    if name == "shipped":
        assert encode is not None
    if encode is None:
        pytest.skip(f"{name}: no piece encoder")
    added = [t.content for t in tok.backend.get_added_tokens_decoder().values() if t.content]
    rng = random.Random(f"piece-encoder-{name}")
    pieces = {p for _ in range(400) for p in re.findall(r" *[^ ]+| +", random_text(rng, rng.randint(1, 30)))}
    pieces = sorted(p for p in pieces if not any(a in p for a in added))
    assert len(pieces) > 300
    assert encode(pieces) == plain(tok, pieces)


def test_the_piece_encoder_declines_what_could_differ(tokenizers, caplog):
    """No encoder for a tokenizer with an added token matched on normalized text, for BPE with dropout, or when a
    probe piece's ids differ from the batch encode's (logged)."""
    from tokenizers import AddedToken, Tokenizer

    shipped = tokenizers("shipped").backend
    assert router_tokenizer.piece_encoder(shipped, lambda texts: plain_of(shipped, texts)) is not None
    normalized = Tokenizer.from_str(shipped.to_str())
    normalized.add_tokens([AddedToken("zq", normalized=True)])
    assert router_tokenizer.piece_encoder(normalized, lambda texts: plain_of(normalized, texts)) is None
    dropout = Tokenizer.from_str(shipped.to_str())
    dropout.model.dropout = 0.5
    assert router_tokenizer.piece_encoder(dropout, lambda texts: plain_of(dropout, texts)) is None
    off_by_one = lambda texts: [[i + 1 for i in ids] for ids in plain_of(shipped, texts)]  # noqa: E731
    assert router_tokenizer.piece_encoder(shipped, off_by_one) is None
    assert "piece encoder off" in caplog.text


def plain_of(backend, texts):
    return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]


def _normalizer(backend):
    """``backend``'s normalizer as ``char_replacements`` reads it (``tokenizer.json``'s ``"normalizer"``)."""
    return json.loads(backend.to_str()).get("normalizer")


def _with_normalizer(backend, normalizer):
    from tokenizers import Tokenizer

    spec = json.loads(backend.to_str())
    spec["normalizer"] = normalizer
    return Tokenizer.from_str(json.dumps(spec))


def _replace(a, b):
    return {"type": "Replace", "pattern": {"String": a}, "content": b}


def test_the_piece_encoder_replaces_characters_itself_where_that_is_all_the_normalizer_does(tokenizers):
    """A normalizer that only replaces single characters (the shipped model's ``" "`` -> ``"▁"``, or a sequence of
    such, none replacing another's result) is applied as ``str.replace``; the ids still equal the batch encode's for
    random pieces (``▁`` as text, the replaced characters themselves). Any other normalizer is left to the
    library: a replacement chained onto another's result, a longer content, ``Prepend``, ``NFC``."""
    shipped = tokenizers("shipped").backend
    assert router_tokenizer.char_replacements(_normalizer(shipped)) == [(" ", "\u2581")]
    two = _with_normalizer(shipped, {"type": "Sequence",
                                     "normalizers": [_replace(" ", "\u2581"), _replace("_", "\u2581")]})
    assert router_tokenizer.char_replacements(_normalizer(two)) == [(" ", "\u2581"), ("_", "\u2581")]
    for backend in (shipped, two):
        encode = router_tokenizer.piece_encoder(backend, lambda texts, b=backend: plain_of(b, texts))
        assert encode is not None
        rng = random.Random("piece-encoder-replacements")
        added = [t.content for t in backend.get_added_tokens_decoder().values() if t.content]
        pieces = {p for _ in range(300) for p in re.findall(r" *[^ ]+| +", random_text(rng, rng.randint(1, 30)))}
        pieces |= {" _x", "__", " \u2581_", " \u2581\u2581", "   "}
        pieces = sorted(p for p in pieces if not any(a in p for a in added))
        assert encode(pieces) == plain_of(backend, pieces)
    for normalizer in (
            {"type": "Sequence", "normalizers": [_replace(" ", "\u2581"), _replace("\u2581", "_")]},  # chained
            _replace(" ", "\u2581\u2581"),
            {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, _replace(" ", "\u2581")]},
            {"type": "NFC"},
            None):
        changed = _with_normalizer(shipped, normalizer)
        assert router_tokenizer.char_replacements(_normalizer(changed)) is None, normalizer


def test_holds_any_finds_what_a_search_for_each_string_finds():
    """``holds_any`` (each group's first character found, its strings tried there; past ``FIRST_CHAR_TRIES`` of them
    a search for each string) == ``any(c in text ...)``: texts of a few characters, many of them the strings' first
    characters (markup full of ``<``), the strings' prefixes, the strings whole, at the start, the end and past the
    tries; strings sharing a first character, one character long, one the prefix of another."""
    contents = ["<unk>", "<pad>", "</s>", "<s>", "\t", "<|im_start|>", "▁▁", "ab", "abc"]
    groups = piece_cache.by_first_char(contents)
    assert sorted(c for g in groups.values() for c in g) == sorted(contents)
    rng = random.Random("holds-any")
    atoms = ["<", "</", "<s", "<u", "<un", "<|im_", "s>", ">", "a", "b", "x", " ", "\n", "▁", "é", "😀",
             *contents]
    found = 0
    for _ in range(20_000):
        k = rng.randint(0, 40)
        weights = [8 if a in contents else 1 for a in atoms] if rng.random() < 0.1 else [
            1 if a in contents else 20 if a[0] in groups else 4 for a in atoms]
        text = "".join(rng.choices(atoms, weights, k=k))
        expected = any(c in text for c in contents)
        assert piece_cache.holds_any(text, groups) == expected, repr(text)
        found += expected
    assert 2_000 < found < 18_000, found
    many = "<" * (piece_cache.FIRST_CHAR_TRIES * 3)
    for tail in ("", "<s>", "x", "\t"):
        assert piece_cache.holds_any(many + tail, groups) == any(c in many + tail for c in contents)
