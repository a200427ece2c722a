"""The generator: deterministic, faithful to Table 2's ranges and proportions, groups share prefixes."""

import math
import time
from collections import Counter, defaultdict
from dataclasses import astuple

import pytest

from sgl_moe.workloads import PAGE, TABLE2, WORKLOADS, WorkloadConfig, generate, prompt_tokens


def snapshot(cfg):
    return [(r.id, r.workload, r.kind, tuple(map(astuple, r.context)), tuple(r.labels),
             tuple(map(astuple, r.choices)), r.group) for r in generate(cfg)]


def test_same_seed_same_requests_other_seed_others():
    a = snapshot(WorkloadConfig(requests=3000, seed=7))
    assert a == snapshot(WorkloadConfig(requests=3000, seed=7))
    b = snapshot(WorkloadConfig(requests=3000, seed=8))
    assert a != b
    keys_a = {seg[0] for r in a for seg in r[3]}
    keys_b = {seg[0] for r in b for seg in r[3] if not seg[0].startswith("\n")}
    assert not keys_a & keys_b  # two seeds share no generated text


def test_a_workload_alone_is_the_mixes_subsequence():
    mix = [r for r in snapshot(WorkloadConfig(requests=20000, seed=2)) if r[1] == "quality"]
    alone = snapshot(WorkloadConfig(workloads=("quality",), requests=len(mix), seed=2))
    assert mix == alone and mix


def test_workloads_as_comma_string_and_bad_configs():
    assert WorkloadConfig(workloads="quality, arxiv").workloads == ("quality", "arxiv")
    for bad in [dict(workloads=("nope",)), dict(workloads=()), dict(workloads=("imdb", "imdb")),
                dict(requests=-1), dict(length_scale=0), dict(max_context=64)]:
        with pytest.raises(ValueError):
            WorkloadConfig(**bad)


def test_kinds_and_labels():
    expected = {"moral": ("choice", 2), "mmlu": ("choice", 4), "boolq": ("classify", 0), "imdb": ("classify", 0),
                "quality": ("choice", 4), "arxiv": ("multi", None)}
    labels = {"boolq": [" yes", " no"], "imdb": [" positive", " negative"]}
    for r in generate(WorkloadConfig(requests=5000, seed=1)):
        kind, n = expected[r.workload]
        assert r.kind == kind
        assert r.labels == labels.get(r.workload, [])
        if n is not None:
            assert len(r.choices) == n
        else:
            assert 3 <= len(r.choices) <= 6 and len({c.key for c in r.choices}) == len(r.choices)


def test_unscaled_lengths_are_table_2s():
    cfg = WorkloadConfig(requests=30000, length_scale=1, max_context=200_000)
    lengths = defaultdict(list)
    for r in generate(cfg):
        lengths[r.workload].append(prompt_tokens(r))
    for w in WORKLOADS:
        lo, hi = TABLE2[w].context
        assert lo <= min(lengths[w]) and max(lengths[w]) <= hi, w
        # the sampled range is covered, not a corner of it
        assert min(lengths[w]) < lo + 0.2 * (hi - lo) and max(lengths[w]) > hi - 0.4 * (hi - lo), w


@pytest.mark.parametrize("scale", [4.0, 8.0])
def test_scaled_lengths_follow_table_2_over_the_scale(scale):
    cfg = WorkloadConfig(requests=30000, length_scale=scale)
    lengths = defaultdict(list)
    instruction_share = []
    for r in generate(cfg):
        n = prompt_tokens(r)
        lengths[r.workload].append(n)
        assert n <= cfg.max_context
        if r.workload == "moral":  # High share: the instruction keeps two pages
            assert r.context[0].tokens >= 2 * PAGE
            instruction_share.append(r.context[0].tokens / n)
    for w in ("mmlu", "boolq", "imdb", "quality", "arxiv"):  # no floor binds at these scales
        lo, hi = TABLE2[w].context
        assert lo / scale - 2 <= min(lengths[w]), w
        assert max(lengths[w]) <= min(hi / scale + 2, cfg.max_context), w
    lo, hi = TABLE2["moral"].context
    assert max(lengths["moral"]) <= 2 * PAGE + hi / scale
    assert sum(instruction_share) / len(instruction_share) > 0.5  # the instruction is most of the prompt


def test_long_documents_are_clipped_to_max_context():
    cfg = WorkloadConfig(workloads=("arxiv",), requests=300, length_scale=1, max_context=3000)
    lengths = [prompt_tokens(r) for r in generate(cfg)]
    assert max(lengths) == 3000


def test_mix_follows_table_2_request_counts():
    n = 100_000
    counts = Counter(r.workload for r in generate(WorkloadConfig(requests=n, seed=4)))
    total = sum(TABLE2[w].requests for w in WORKLOADS)
    for w in WORKLOADS:
        p = TABLE2[w].requests / total
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(counts[w] - n * p) < 5 * sigma, (w, counts[w], n * p)


def test_subset_is_renormalised():
    counts = Counter(r.workload for r in generate(WorkloadConfig(workloads=("moral", "boolq"), requests=30000)))
    assert set(counts) == {"moral", "boolq"}
    assert abs(counts["moral"] / 30000 - 2 / 3) < 0.02


def test_groups_share_their_leading_segments():
    by_group = defaultdict(list)
    for r in generate(WorkloadConfig(requests=40000, seed=3)):
        by_group[r.group].append(r)
    shared = 0
    for group, reqs in by_group.items():
        if len(reqs) < 2:
            continue
        shared += 1
        first = reqs[0].context[0]
        assert first.key == group and first.tokens >= PAGE
        assert all(r.context[0] == first and r.workload == reqs[0].workload for r in reqs)
    assert shared > 10
    # requests not in a common group do not share a leading page-long segment
    leading = defaultdict(set)
    for group, reqs in by_group.items():
        for r in reqs:
            if r.context[0].tokens >= PAGE:
                leading[r.context[0].key].add(group)
    assert all(len(groups) == 1 for groups in leading.values())


def test_group_sizes_and_spreading():
    quality = list(generate(WorkloadConfig(workloads=("quality",), requests=3000)))
    sizes = Counter(r.group for r in quality)
    complete = [n for n in sizes.values()][:-10]  # the last open groups may be cut by the end of the run
    assert min(complete) >= 5 and max(sizes.values()) <= 10
    assert all(a.group != b.group for a, b in zip(quality, quality[1:]))  # never adjacent
    boolq = list(generate(WorkloadConfig(workloads=("boolq",), requests=30000)))
    per_passage = Counter(r.context[0].key for r in boolq)
    assert 1.4 < len(boolq) / len(per_passage) < 1.6
    assert max(per_passage.values()) == 3


def test_a_key_always_has_the_same_length():
    tokens = {}
    for r in generate(WorkloadConfig(requests=30000, seed=9)):
        for seg in [*r.context, *r.choices]:
            assert tokens.setdefault(seg.key, seg.tokens) == seg.tokens


def test_ids_number_each_workload_in_order():
    seen = Counter()
    for r in generate(WorkloadConfig(requests=2000)):
        assert r.id == f"{r.workload}-{seen[r.workload]:06d}"
        seen[r.workload] += 1


def test_a_million_requests_generate_quickly():
    start = time.perf_counter()
    n = sum(1 for _ in generate(WorkloadConfig(requests=1_000_000)))
    elapsed = time.perf_counter() - start
    print(f"\n1,000,000 requests of the mix generated in {elapsed:.2f} s")
    assert n == 1_000_000
    assert elapsed < 60
