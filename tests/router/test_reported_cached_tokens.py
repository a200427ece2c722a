"""``reported_cached_tokens``: the cached tokens a worker's answer reports, read at the key when the answer is one
object holding it once, else parsed whole. The two readings agree on SGLang's answers (small, and with a
log-probability per prompt token) and on answers shaped to trip the scan."""

from __future__ import annotations

import orjson
import pytest

from sgl_moe.router.front.forwarding import reported_cached_tokens, reported_cached_tokens_parsed


def _generate(cached: object, **extra: object) -> dict:
    return {"text": "yes", "output_ids": [9], "meta_info": {"id": "r1", "finish_reason": {"type": "length"},
                                                           "prompt_tokens": 4000, "completion_tokens": 1,
                                                           "cached_tokens": cached, "e2e_latency": 0.25}, **extra}


def _logprobs(n: int) -> list:
    return [[-0.123456 * (i % 7), 1000 + i, None] for i in range(n)]


ANSWERS = [
    ("/generate", _generate(3584)),
    ("/generate", _generate(0)),
    ("/generate", _generate(7, input_token_logprobs=_logprobs(4000))),  # a scoring answer: ~100 kB
    ("/generate", _generate(None)),
    ("/generate", _generate(12.0)),
    ("/generate", _generate("12")),
    ("/generate", _generate(-3)),
    ("/generate", [_generate(5), _generate(6)]),  # a batch: the key twice, parsed whole
    ("/generate", [_generate(5)]),
    ("/generate", {"text": 'he wrote "cached_tokens": 99 in the text', "meta_info": {"cached_tokens": 4}}),
    ("/generate", {"text": "no meta_info"}),
    ("/generate", {"meta_info": None}),
    ("/generate", {"meta_info": {"cached_tokens": 1, "note": {"cached_tokens": 2}}}),  # twice: parsed whole
    ("/v1/completions", {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 9, "completion_tokens": 1,
                                                                "prompt_tokens_details": {"cached_tokens": 8}}}),
    ("/v1/chat/completions", {"choices": [], "usage": {"prompt_tokens_details": None}}),
    ("/v1/chat/completions", {"usage": None}),
    ("/v1/completions", [1, 2]),
]


@pytest.mark.parametrize("endpoint, answer", ANSWERS, ids=[f"{e}-{i}" for i, (e, _) in enumerate(ANSWERS)])
@pytest.mark.parametrize("indent", [False, True])
def test_the_scan_reads_what_the_whole_parse_reads(endpoint, answer, indent):
    payload = orjson.dumps(answer, option=orjson.OPT_INDENT_2 if indent else 0)
    assert reported_cached_tokens(endpoint, payload) == reported_cached_tokens_parsed(endpoint, payload)


def test_figures_for_sglangs_answers():
    assert reported_cached_tokens("/generate", orjson.dumps(_generate(3584))) == 3584
    scoring = orjson.dumps(_generate(7, input_token_logprobs=_logprobs(4000)))
    assert len(scoring) > 50_000 and reported_cached_tokens("/generate", scoring) == 7
    assert reported_cached_tokens("/generate", orjson.dumps([_generate(5), _generate(6)])) == 11
    assert reported_cached_tokens("/generate", b'{"meta_info": {"cached_tokens": 12}}') == 12  # spaces after the colon
    assert reported_cached_tokens("/generate", b'{"meta_info":{"cached_tokens":012}}') is None  # not JSON
    assert reported_cached_tokens("/generate", b"not json") is None
    assert reported_cached_tokens("/v1/score", orjson.dumps(_generate(3))) is None  # a route that reports none
