"""The prefix memo gives exactly the ids of a whole encode, for every fixture tokenizer.

Properties, checked with seeded random and adversarial texts:
- a cut ``CutRule`` allows splits the ids: ``plain(t[:c]) + plain(t[c:]) == plain(t)``, at every allowed position
  of texts built to break it (whitespace runs at the cut, combining characters, emoji ZWJ sequences, special
  tokens written as text, chat-template output);
- the memo's ids equal ``encode_batch`` without it, for streams of texts that share prefixes of random length;
- its page hashes equal ``block_hashes`` of those ids; eviction and threads change nothing;
- a memo whose rule is wrong is caught by the sampled whole encode and turns itself off.
"""

import array
import dataclasses
import json
import random
import shutil
import threading

import orjson
import pytest

from sgl_moe.router.front.attempt import Attempt
from sgl_moe.router.request import token_cuts
from sgl_moe.router.request.block_hash import block_hashes, salt_seed
from sgl_moe.router.request.parsed_request import Namespace, ParsedRequest
from sgl_moe.router.request.prefix_memo import PrefixMemo, ids_json, page_hashes
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.router.request.token_cuts import CutRule
from sgl_moe.router.request.token_ids import TokenIds
from sgl_moe.worker.info import tokenizer_files

from .test_router_tokenizer import DECLARED, GENERIC, MESSAGES, PROBES, variant_dir

ATOMS = [
    "the", "cat", "Hello", "world", "x", "42", "3.14", "naïve", "café", "e\u0301", "a\u0308\u0301", "中文", "日本語",
    "한국어", "\u1100\u1161", "Ελλάδα", "مرحبا", "🙂", "👨\u200d👩\u200d👧", "👍🏽", "\u200b", "\ufffd", "\u00a0",
    " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "  \n  ", "\n ", ".", ",", "'s", "'ll", "--", "...", "#", "|",
    "-", "`", "(", ")", "{", "}", "<", ">", "/", "<s>", "</s>", "<unk>", "<pad>", "<|im_start|>", "<|im_end|>",
    "<|endoftext|>", "<think>", "</think>", "[INST]", "[/INST]", "<|im_start|", "<s", "s>", "▁", "▁▁", "def", "return",
]
"""Pieces random texts are made of: words, numbers, combining sequences, ZWJ emoji, whitespace runs, newlines,
punctuation, special and added tokens written as text (and broken ones)."""

TOKENIZERS = ["shipped", "qwen", "llama", "qwen-as-llama-fast", *DECLARED, *GENERIC]


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ATOMS) if rng.random() < 0.6 else rng.choice(ATOMS[:10]) + " " for _ in range(n))


def chat_texts(tok: RouterTokenizer) -> list[str]:
    if not tok.has_chat_template:
        return []
    return [tok.apply_chat_template(MESSAGES[:k], add_generation_prompt=add) for k in (1, 2, 4) for add in (True,
                                                                                                             False)]


@pytest.fixture(scope="module")
def tokenizers(request, variants_root):
    def load(name):
        if name == "qwen-as-llama-fast":  # a byte-level tokenizer.json declared LlamaTokenizerFast
            qwen = request.getfixturevalue("qwen_model_dir")
            out = variants_root / name
            if not out.exists():
                shutil.copytree(qwen, out)
                config = json.loads((out / "tokenizer_config.json").read_text())
                config.update(tokenizer_class="LlamaTokenizerFast", add_bos_token=True)
                (out / "tokenizer_config.json").write_text(json.dumps(config))
            model_dir = out
        else:
            model_dir = variant_dir(name, request, variants_root)
        files = tokenizer_files(str(model_dir)).files
        return RouterTokenizer.from_file_bytes({f: (model_dir / f).read_bytes() for f in files})

    cache = {}
    return lambda name: cache.setdefault(name, load(name)) if name not in cache else cache[name]


@pytest.fixture(scope="module")
def variants_root(tmp_path_factory):
    return tmp_path_factory.mktemp("memo-tokenizers")


def plain(tok, texts):
    return [e.ids for e in tok.backend.encode_batch_fast(texts, add_special_tokens=False)]


def full(tok, texts):
    return [e.ids for e in tok.backend.encode_batch_fast(texts, add_special_tokens=True)]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_an_allowed_cut_splits_the_ids(name, tokenizers):
    tok = tokenizers(name)
    if tok.memo is None:
        pytest.skip(f"{name}: no memo ({tok.memo_off_reason})")
    rule, rng = tok.memo.rule, random.Random(name)
    texts = [*PROBES, *chat_texts(tok)] + [random_text(rng, rng.randint(5, 60)) for _ in range(150)] + [
        "\n".join(random_text(rng, 4) for _ in range(8)) for _ in range(50)]  # lines: where regex pieces are cut
    checked = 0
    for text in texts:
        whole = plain(tok, [text])[0]
        cuts = [c for c in range(1, len(text)) if rule.allows(text, c)]
        pairs = plain(tok, [p for c in cuts for p in (text[:c], text[c:])])
        for i, c in enumerate(cuts):
            assert pairs[2 * i] + pairs[2 * i + 1] == whole, (name, text, c)
        checked += len(cuts)
    assert checked > 100, f"{name}: the rule allowed only {checked} cuts"


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_next_cut_scan_in_c_equals_its_python_reference(name, tokenizers):
    """``CutRule.next_cut`` (``native_cut_scan``) finds the cut ``next_cut_py`` finds from every place, for every
    fixture rule and variants of it with each flag the scan reads turned (ASCII at the cut, lowercase added tokens,
    no whitespace before a newline, a space before each cut)."""
    tok = tokenizers(name)
    if tok.memo is None:
        pytest.skip(f"{name}: no memo ({tok.memo_off_reason})")
    base, rng = tok.memo.rule, random.Random(name + "scan")
    rules = [base, dataclasses.replace(base, ascii_at_cut=not base.ascii_at_cut),
             dataclasses.replace(base, lowercase_added=not base.lowercase_added),
             dataclasses.replace(base, space_before_newline=not base.space_before_newline),
             dataclasses.replace(base, space_before_cut=not base.space_before_cut)]
    texts = [*PROBES, *chat_texts(tok)] + [random_text(rng, rng.randint(5, 60)) for _ in range(60)] + [
        "\n".join(random_text(rng, 4) for _ in range(8)) for _ in range(30)] + [
        "".join(rng.choice(ATOMS).upper() if rng.random() < 0.3 else rng.choice(ATOMS) for _ in range(40))
        for _ in range(30)]
    compared = found = 0
    for rule in rules:
        assert (rule._scan is not None) == token_cuts.NATIVE
        for text in texts:
            n = len(text)
            for c in range(1, n):
                for stop in (min(n, c + 1), min(n, c + 7), n):
                    got = rule.next_cut(text, c, stop)
                    assert got == rule.next_cut_py(text, c, stop), (name, rule.family, text, c, stop)
                    compared += 1
                    found += got is not None
                assert rule.allows(text, c) == rule.allows_py(text, c), (name, rule.family, text, c)
    assert found > 1000 and compared - found > 1000, (found, compared)


@pytest.mark.parametrize("name", ["shipped", "qwen", "llama"])
def test_the_scan_judges_added_tokens_at_the_cut_as_the_regex_does(name, tokenizers):
    """Cuts next to added tokens written as text (whole, cut short, overlapping, at the text's ends, upper-cased for
    rules that lowercase): the scan in C compares the added tokens' contents around the cut where the Python rule
    runs its regex; both say the same at every place, and places the scan leaves to Python are only non-ASCII
    windows of lowercasing rules."""
    tok = tokenizers(name)
    if tok.memo is None:
        pytest.skip(f"{name}: no memo ({tok.memo_off_reason})")
    base, rng = tok.memo.rule, random.Random(name + "added")
    if not base.added_contents:
        pytest.skip(f"{name}: no added tokens")
    pieces = [*base.added_contents, *(t[:-1] for t in base.added_contents), *(t[1:] for t in base.added_contents),
              *(t.upper() for t in base.added_contents), "\n", "\nx", " ", "a", "é", "İ", "ß"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(400)]
    texts += [a + b for a in base.added_contents[:6] for b in base.added_contents[:6]]
    for rule in (base, dataclasses.replace(base, lowercase_added=not base.lowercase_added)):
        scan = rule._scan
        assert (scan is not None) == token_cuts.NATIVE
        covered = asked = 0
        for text in texts:
            for c in range(1, len(text)):
                assert rule.allows(text, c) == rule.allows_py(text, c), (name, text, c)
                assert rule.next_cut(text, c, len(text)) == rule.next_cut_py(text, c, len(text)), (name, text, c)
                if scan is not None and rule._added_token_covers(text, c):
                    covered += 1
                    p = scan.next(text, c, c + 1)
                    asked += p is not None and p < 0
                    assert p is None or p < 0, (name, text, c, p)  # never allowed where an added token covers it
        assert covered > 100, (name, covered)
        if not rule.lowercase_added:
            assert asked == 0, (name, asked)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_memo_ids_equal_a_whole_encode(name, tokenizers):
    tok = tokenizers(name)
    if tok.memo is None:
        pytest.skip(f"{name}: no memo ({tok.memo_off_reason})")
    memo = fresh(tok, segment_chars=24)
    rng = random.Random(f"stream-{name}")
    bases = ["\n".join(random_text(rng, 8) for _ in range(10)) for _ in range(6)] + chat_texts(tok)
    texts = []
    for _ in range(120):
        base = rng.choice(bases)
        cut = rng.randint(0, len(base))
        texts.append(base[:cut] + random_text(rng, rng.randint(0, 8)))
    for batch in (texts[i:i + rng.randint(1, 5)] for i in range(0, len(texts), 5)):
        ids, paths = memo.encode_batch(batch)
        assert ids == full(tok, batch), (name, batch)
        assert all(type(p) is TokenIds for p in ids)  # packed, whether through a path, a hint or in one piece
        for p, path in zip(ids, paths):
            for page, seed in ((1, None), (4, None), (16, salt_seed("tenant"))):
                assert page_hashes(path, p, page, seed) == block_hashes(p, page, seed) == block_hashes(
                    list(p), page, seed)
    assert memo.stats.memo_ids > 300 and memo.stats.mismatches == 0
    assert memo.stats.hinted >= 5, f"{name}: {memo.stats.hinted} texts started at a hint"
    listed = tok.encode_batch(texts)
    assert listed == full(tok, texts) and all(type(p) is list for p in listed)  # the tokenizer's own memo too


@pytest.mark.parametrize("name", TOKENIZERS)
def test_texts_that_leave_a_memoised_path_just_after_a_segment_get_whole_encode_ids(name, tokenizers):
    """A segment's end is checked only where the text could differ within ``rule.reach`` of it (``_plan``): every
    text here follows a memoised path up to a segment's end, then goes on with each atom (added tokens, pairs BPE
    merges, whitespace runs), or with the path's next segment cut short."""
    tok = tokenizers(name)
    if tok.memo is None:
        pytest.skip(f"{name}: no memo ({tok.memo_off_reason})")
    memo = fresh(tok, segment_chars=16)
    rng = random.Random(f"leave-{name}")
    bases = ["\n".join(f"line {j}: " + random_text(rng, 2) + "." for j in range(12)) for _ in range(3)]
    for _ in range(2):  # seen twice: memoised
        memo.encode_batch(bases)
    texts = []
    paths = memo.encode_batch(bases)[1]
    assert sum(map(len, paths)) > 3, name
    for base, path in zip(bases, paths):
        ends = [node.chars for node in path]
        for c in ends:
            texts += [base[:c] + atom for atom in ATOMS] + [base[:c] + atom + base[c:] for atom in ATOMS[::3]]
            texts += [base[:c + k] for k in range(1, 4)] + [base[:c + 1] + atom for atom in ATOMS[::5]]
    for i in range(0, len(texts), 50):
        batch = texts[i:i + 50]
        assert memo.encode_batch(batch)[0] == full(tok, batch), name
    assert memo.stats.memo_ids > 1000 and memo.stats.hinted > 100, (name, memo.stats)


def fresh(tok, **kw) -> PrefixMemo:
    """A memo like the tokenizer's own, without the sampled check (the property is what is tested)."""
    memo = tok.memo
    return PrefixMemo(memo.rule, memo._encode_plain, memo._encode_full, memo.prefix, memo.suffix,
                      check_every=10**9, **kw)


def test_which_tokenizers_are_cut(tokenizers):
    """The fixture tokenizers the memo serves, and why the others are encoded whole."""
    families = {name: (tokenizers(name).memo.rule.family if tokenizers(name).memo else tokenizers(name).memo_off_reason)
                for name in ["shipped", "qwen", "llama", "qwen-as-llama-fast", "as-codellama"]}
    assert families["shipped"] == "whole-text-bpe"
    assert families["qwen"] == "regex-pieces"
    assert families["qwen-as-llama-fast"] == "regex-pieces"  # SGLang's fix restores the file's pre-tokenizer
    assert families["llama"] == "whole-text-bpe"
    assert tokenizers("llama").memo.prefix == [1]  # BOS in front of the memoised ids
    assert tokenizers("as-codellama").memo is None  # overrides encoding: not a stock tokenizer


def test_a_wrong_rule_is_caught_by_the_sampled_check(tokenizers):
    tok = tokenizers("shipped")
    rule = tok.memo.rule
    anything = CutRule("whole-text-bpe", frozenset(), {}, False, False, frozenset(), rule.added_pattern, 0, False)
    memo = PrefixMemo(anything, tok.memo._encode_plain, tok.memo._encode_full, [], [], segment_chars=3,
                      check_every=1)
    text = "Hello world, the cat sat on the mat. " * 4
    assert memo.encode_batch([text])[0] == full(tok, [text])  # seen once: encoded in one piece
    ids, paths = memo.encode_batch([text])  # the second time its segments are cut, by the wrong rule
    assert ids == full(tok, [text])  # the check's whole encode is what is returned
    assert memo.stats.mismatches == 1 and not memo.enabled and "differ" in memo.disabled_reason
    assert memo.encode_batch([text + "x"])[0] == full(tok, [text + "x"]) and memo.tokens == 0


def test_the_check_interval_doubles_after_clean_checks_and_still_catches_a_wrong_rule(tokenizers):
    """32 clean checks at each interval, then twice the interval, up to the most; a wrong rule that shows only
    later is caught within one interval at the most."""
    from sgl_moe.router.request.prefix_memo import CHECKS_PER_DOUBLING

    tok = tokenizers("shipped")
    rule = tok.memo.rule
    anything = CutRule("whole-text-bpe", frozenset(), {}, False, False, frozenset(), rule.added_pattern, 0, False)
    memo = PrefixMemo(anything, tok.memo._encode_plain, tok.memo._encode_full, [], [], segment_chars=3,
                      check_every=1, check_every_max=4)
    letters = "abcdefghijklmnopqrstuvwxyz"
    # no two share their first 3 characters (a segment): none is ever cut
    unique = [f"{a}{b}{c} and more words" for a in letters for b in letters for c in "xyz"]
    unique = unique[:CHECKS_PER_DOUBLING * 7 + 40]
    seen = []
    for text in unique:  # seen once each: encoded in one piece, so every check is clean
        memo.encode_batch([text])
        seen.append((memo.stats.checks, memo.check_every))
    assert seen[CHECKS_PER_DOUBLING - 2] == (CHECKS_PER_DOUBLING - 1, 1)
    assert seen[CHECKS_PER_DOUBLING - 1] == (CHECKS_PER_DOUBLING, 2)  # the 32nd clean check doubles it
    assert seen[CHECKS_PER_DOUBLING * 3 - 1] == (CHECKS_PER_DOUBLING * 2, 4)
    assert memo.check_every == 4 and memo.stats.checks == CHECKS_PER_DOUBLING * 3 + 10  # capped at the most
    text = "Hello world, the cat sat on the mat. " * 4
    sights = 0
    while memo.enabled and sights < 6:  # from the second sight on, cut by the wrong rule
        ids = memo.encode_batch([text])[0]
        sights += 1
    assert not memo.enabled and memo.stats.mismatches == 1 and sights <= 1 + 4
    assert ids == full(tok, [text])


def test_eviction_keeps_the_budget_and_the_ids(tokenizers):
    tok = tokenizers("qwen")
    memo = fresh(tok, segment_chars=16, budget_tokens=300)
    rng = random.Random(3)
    lines = [random_text(rng, 6) for _ in range(30)]
    texts = ["\n".join(rng.choice(lines[:5]) for _ in range(rng.randint(1, 8))) + "\n" + rng.choice(lines)
             for _ in range(80)]
    for t in texts:
        assert memo.encode_batch([t])[0] == full(tok, [t])
        assert memo.tokens <= 300
    assert memo.stats.memo_ids > 0


def test_threads_share_one_memo(tokenizers):
    tok = tokenizers("shipped")
    memo = fresh(tok, segment_chars=32)
    rng = random.Random(5)
    bases = [random_text(rng, 60) for _ in range(4)]
    texts = [rng.choice(bases)[: rng.randint(50, 300)] + random_text(rng, 3) for _ in range(200)]
    errors = []

    def work(chunk):
        for t in chunk:
            if memo.encode_batch([t])[0] != full(tok, [t]):
                errors.append(t)

    threads = [threading.Thread(target=work, args=(texts[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and memo.stats.texts == 200


def test_in_service_the_memo_serves_shared_prefixes_and_reports_it(tmp_path_factory):
    """Through the router: later requests' prefix ids come from the memo (a few segments more each time), the
    worker receives the ids of a whole encode, and ``/metrics`` says how many ids the memo gave."""
    from doubles.stand_in import tokenizer_dir

    from sgl_moe.router.front.service import ROUTER

    from .test_hardening import Setup

    setup = Setup(tokenizer_dir(tmp_path_factory.mktemp("tok"), template=True))
    try:
        client = setup.client("memo")
        tok = client.server.app[ROUTER].pool.tokenizer
        shared = "\n".join(f"Rule {i}: answer with one word, the label that fits the text best." for i in range(30))
        texts = [f"{shared}\nText: the cat sat on mat number {i}." for i in range(8)]
        for text in texts:
            status, _, _ = setup.call(client, "POST", "/generate", json={"text": text,
                                                                        "sampling_params": {"max_new_tokens": 0}})
            assert status == 200
        sent = [body["input_ids"] for s in setup.stand_ins for path, body in s.received if path == "/generate"]
        assert sorted(sent) == sorted(full(tok, texts))

        async def metrics() -> str:
            async with client.get("/metrics") as r:
                return await r.text()
        text = setup.loop.run_until_complete(metrics())
        ids_line = 'sgl_moe_router_prefix_memo_ids_total{kind="generate"}'
        line = next(x for x in text.splitlines() if x.startswith(ids_line))
        assert float(line.split()[-1]) >= 2 * len(full(tok, [shared])[0]) * 0.8
        assert 'sgl_moe_router_prefix_memo_enabled{kind="generate"} 1.0' in text
        kept_line = 'sgl_moe_router_piece_cache_pieces_total{source="kept"}'
        kept = next(x for x in text.splitlines() if x.startswith(kept_line))
        assert float(kept.split()[-1]) > 0  # the texts' tails share words
    finally:
        setup.close()


def test_text_seen_once_costs_no_nodes_and_a_prefix_seen_again_is_memoised(tokenizers):
    tok = tokenizers("shipped")
    memo = fresh(tok, segment_chars=32)
    rng = random.Random(9)
    prefix = random_text(rng, 120)
    for _ in range(20):  # unique texts: remembered as seen, never stored
        memo.encode_batch([random_text(rng, 60)])
    assert memo.tokens == 0 and memo.stats.memo_ids == 0
    first = memo.encode_batch([prefix + " one"])[0][0]
    assert memo.tokens == 0  # seen once
    memo.encode_batch([prefix + " two"])
    assert memo.tokens > 0  # seen twice: its first segments are nodes now
    ids = memo.encode_batch([prefix + " three"])[0][0]
    assert memo.stats.memo_ids > 0 and ids == full(tok, [prefix + " three"])[0]
    assert first == full(tok, [prefix + " one"])[0]


def memo_nodes(memo: PrefixMemo) -> list:
    """Every node reachable from the root (the root left out)."""
    out, stack = [], [memo._root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(c for bucket in node.children.values() for c in bucket.values())
    return out[1:]


def test_eviction_drops_the_least_recently_used_paths_and_leaves_no_orphans(tokenizers):
    """A text stamps only its path's deepest node; a pass drops the paths no text used lately, never a node before
    the nodes under it, and leaves the memo's count equal to the ids its reachable nodes hold."""
    tok = tokenizers("shipped")
    memo = fresh(tok, segment_chars=32, budget_tokens=10**9)
    rng = random.Random(11)
    prefixes = [random_text(rng, 80) for _ in range(6)]
    for p in prefixes:
        for k in range(4):  # seen again and again: memoised deeper each time
            memo.encode_batch([p + f" tail {k}"])
    nodes = memo_nodes(memo)
    assert memo.tokens == sum(len(n.ids) for n in nodes) > 0
    kept = prefixes[-1]
    memo.encode_batch([kept + " again"])  # the most recent use
    kept_path = memo.encode_batch([kept + " once more"])[1][0]
    assert len(kept_path) > 1
    memo.budget_tokens = 2 * sum(len(n.ids) for n in kept_path)  # a pass leaves 1.8 paths of the six
    memo.encode_batch([kept + " and again"])  # over budget: a pass runs after this text
    left = memo_nodes(memo)
    assert memo.tokens == sum(len(n.ids) for n in left) <= memo.budget_tokens
    assert all(n.alive for n in left) and all(n in left for n in kept_path), "the recently used path was dropped"
    gone = [n for n in nodes if n not in left]
    assert gone and not any(n.alive for n in gone)
    assert all(n.parent is None or n.parent.depth == 0 or n.parent in left for n in left), "an orphan was left"
    for p in prefixes:  # dropped paths and hints come back as whole-encode ids
        text = p + " after eviction"
        assert memo.encode_batch([text])[0][0] == full(tok, [text])[0]


def test_a_node_evicted_between_plan_and_assembly_gets_no_children(tokenizers):
    tok = tokenizers("shipped")
    memo = fresh(tok, segment_chars=32)
    rng = random.Random(12)
    prefix = random_text(rng, 150)
    for k in range(3):
        memo.encode_batch([prefix + f" x{k}"])
    text = prefix + " y"
    plan = memo._plan(text)
    assert plan.path, "nothing memoised"
    for n in memo_nodes(memo):  # another thread's eviction pass, between this text's plan and its assembly
        n.alive = False
    memo._root.children.clear()
    memo.tokens = 0
    encoded = plain(tok, plan.to_encode)
    ids, _ = memo._assemble(plan, encoded)
    assert ids == full(tok, [text])[0] and memo.tokens == 0 and not memo._root.children


def test_a_hints_deepest_node_keeps_the_paths_page_hashes_while_the_hint_lives(tokenizers):
    tok = tokenizers("shipped")
    memo = fresh(tok, segment_chars=32)
    rng = random.Random(13)
    prefix = random_text(rng, 200)
    for k in range(6):
        ids, paths = memo.encode_batch([prefix + f" tail number {k}"])
        for page, seed in ((1, None), (16, None), (16, salt_seed("t"))):
            assert page_hashes(paths[0], ids[0], page, seed) == block_hashes(ids[0], page, seed)
    assert memo.stats.hinted >= 2
    [hint] = memo._hints[prefix[:32]]
    deepest = hint.path[-1]
    assert deepest.hint_refs == 1 and set(deepest.through) == {(1, None), (16, None), (16, salt_seed("t"))}
    kept, _ = deepest.through[(16, None)]
    assert kept == block_hashes(hint.ids, 16)[:deepest.end // 16]
    kept[:] = array.array("q", [0] * len(kept))  # what a hinted text's hashes start from: a wrong chain would show
    ids, paths = memo.encode_batch([prefix + " tail number 99"])
    assert paths[0][:len(hint.path)] == hint.path
    assert page_hashes(paths[0], ids[0], 16, None)[:len(kept)] == kept
    memo._drop_hint(memo._hints[prefix[:32]].pop())
    assert deepest.hint_refs == 0 and deepest.through is None


@pytest.mark.parametrize("name", TOKENIZERS)
def test_ids_json_writes_the_ids_as_orjson_does(name, tokenizers):
    """``ids_json`` (the worker-bound ``input_ids``) equals ``orjson.dumps`` of the memo's ids for texts that share
    prefixes of random length, through hints and not, special tokens and all; a request's body written with it is
    the body ``orjson`` writes."""
    tok = tokenizers(name)
    if tok.memo is None:
        pytest.skip(f"{name}: no memo ({tok.memo_off_reason})")
    memo, rng = fresh(tok, segment_chars=24), random.Random(name + "json")
    prefixes = ["\n".join(random_text(rng, rng.randint(2, 8)) for _ in range(rng.randint(3, 12))) + "\n"
                for _ in range(4)]  # lines: where regex pieces are cut
    reused = 0
    for _ in range(120):
        prefix = rng.choice(prefixes)  # whole (a shared prompt's instructions) or cut anywhere
        text = (prefix if rng.random() < 0.7 else prefix[:rng.randint(0, len(prefix))]) + random_text(rng, rng.randint(
            0, 6))
        if not text:
            continue
        [ids], [path] = memo.encode_batch([text])
        reused += any(n.through_json for n in path)
        assert ids_json(path, ids) == orjson.dumps(list(ids)), (name, text)
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}, "rid": "r"}
        parsed = ParsedRequest("/generate", body, [ids], len(ids), Namespace(), True, False, 1, None, True, [path])
        want = orjson.dumps({"input_ids": list(ids), "sampling_params": {"max_new_tokens": 1}})
        assert Attempt.of("/generate", dict(body), {}, True, parsed.input_ids_json()).unnamed == want
    assert reused > 20, reused


def test_a_hints_ids_json_is_reused_and_goes_with_the_hint(tokenizers):
    tok = tokenizers("shipped")
    memo = fresh(tok, segment_chars=32)
    prefix = random_text(random.Random(14), 200)
    for k in range(12):
        ids, paths = memo.encode_batch([prefix + f" tail number {k}"])
        ids_json(paths[0], ids[0])
    [hint] = memo._hints[prefix[:32]]
    deepest = hint.path[-1]
    assert deepest.through_json == orjson.dumps(list(hint.ids))[:-1]
    deepest.through_json = b"[7"  # what a hinted text's JSON starts from: a wrong text would show
    ids, paths = memo.encode_batch([prefix + " tail number 99"])
    assert ids_json(paths[0], ids[0]).startswith(b"[7,")
    memo._drop_hint(memo._hints[prefix[:32]].pop())
    assert deepest.hint_refs == 0 and deepest.through_json is None
    assert ids_json(paths[0], ids[0]) == orjson.dumps(list(ids[0]))  # no hint left on the path: written whole


def test_a_hint_that_goes_on_takes_the_json_of_the_one_it_replaces_and_writes_only_the_ids_after_it(tokenizers,
                                                                                                    monkeypatch):
    """A popular prefix is memoised further each time it is seen again, and each time its hint moves to a deeper
    node. The JSON text kept for the hint it replaces goes on with it, so such a text writes only the ids after
    that: before, the new end was marked, the old end's text dropped, and the whole prompt written again twice."""
    from sgl_moe.router.request import prefix_memo

    tok = tokenizers("shipped")
    memo = fresh(tok, segment_chars=32)
    prefix = random_text(random.Random(15), 900)
    real, written = prefix_memo.json_text, []

    def counted(ids, start=0, end=None):
        written.append((len(ids) if end is None else end) - start)
        return real(ids, start, end)

    monkeypatch.setattr(prefix_memo, "json_text", counted)
    went_on = 0
    for k in range(14):
        text = prefix + f" tail number {k}"
        before = [(h.path[-1], h.path[-1].end) for h in memo._hints.get(prefix[:32], ())
                  if h.path[-1].through_json and text.startswith(h.text)]
        written.clear()
        [ids], [path] = memo.encode_batch([text])
        assert ids_json(path, ids) == orjson.dumps(list(ids)), k
        if before and before[0][0] is not path[-1] and before[0][0] in path:  # the hint went on from a written end
            went_on += 1
            assert path[-1].through_json == orjson.dumps(list(ids[:path[-1].end]))[:-1]
            assert sum(written) == len(ids) - before[0][1], (k, written)
    assert went_on >= 2, went_on
