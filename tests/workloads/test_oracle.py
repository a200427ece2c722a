"""The oracle cache on hand-made requests and on generated ones."""

from sgl_moe.workloads import (
    PAGE,
    OracleCache,
    Segment,
    WorkloadConfig,
    WorkloadRequest,
    generate,
    literal,
    oracle_cached_tokens,
    unit_segments,
)


def req(rid, context, kind="classify", choices=()):
    return WorkloadRequest(rid, "test", kind, list(context), [" yes", " no"] if kind == "classify" else [],
                           list(choices), rid)


def test_hand_made_example():
    a, b, c, d = Segment("a", 20), Segment("b", 10), Segment("c", 5), Segment("d", 40)
    x, y = Segment("x#0", 1), Segment("x#1", 2)
    cand, question = literal("\nCandidate:"), literal("\nDoes the candidate apply? Answer:")
    requests = [
        req("r1", [a, b]),              # 30 tokens, nothing cached yet
        req("r2", [a, c]),              # shares a (20) -> one page
        req("r3", [a, b]),              # whole prompt seen: at most len-1 = 29 -> one page
        req("r4", [d], "multi", [x, y]),  # sibling 1 new; sibling 2 shares d + "\nCandidate:"
        req("r5", [b, a]),              # b first: no prefix shared with anything
    ]
    sibling = 40 + cand.tokens + question.tokens
    cached, total = oracle_cached_tokens(requests)
    assert total == 30 + 25 + 30 + (sibling + 1) + (sibling + 2) + 30
    assert cached == 0 + 16 + 16 + 0 + (40 + cand.tokens) // 16 * 16 + 0
    assert oracle_cached_tokens(requests, page=1)[0] == 0 + 20 + 29 + 0 + 40 + cand.tokens + 0


def test_choice_unit_includes_the_listing():
    a = Segment("long", 64)
    first = req("q1", [a], "choice", [Segment("c#0", 3), Segment("c#1", 3)])
    same = req("q2", [a], "choice", [Segment("c#0", 3), Segment("c#1", 3)])
    cache = OracleCache(PAGE)
    (unit,) = unit_segments(first)
    assert cache.prefill(unit) == 0
    length = sum(s.tokens for s in unit)
    assert length > 64 + 6
    assert cache.prefill(unit_segments(same)[0]) == (length - 1) // PAGE * PAGE


def test_generated_workloads_share_as_table_2_says():
    def fraction(workload):
        cached, total = oracle_cached_tokens(generate(WorkloadConfig(workloads=(workload,), requests=400)))
        return cached / total

    assert fraction("moral") > 0.4      # High: the shared instruction
    assert fraction("quality") > 0.6    # High: 5-10 questions per document
    assert fraction("arxiv") > 0.5      # Medium: the siblings share the document
    assert fraction("mmlu") < 0.1 and fraction("imdb") < 0.1  # Low at scale 8
