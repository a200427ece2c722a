"""Nesting depth of the grammars a request carries (``grammar_limits``): what counts as a level and what does not."""

import pytest

from sgl_moe.router.errors import RequestError
from sgl_moe.router.request.grammar_limits import check_grammars, ebnf_depth, json_depth, regex_depth


@pytest.mark.parametrize(("pattern", "depth"), [
    ("abc", 0),
    ("(a(b)c)", 2),
    (r"\(\(\(a\)", 0),  # escaped parentheses are literals
    ("[(((]x", 0),  # so are bracketed ones
    ("[]((]x(y)", 1),  # a ']' first in a class is literal: the class ends at the second one
    ("[^]((]x", 0),
    (r"[\]((]x", 0),  # an escaped ']' does not end the class
    ("(?:a|(?P<n>b))", 2),
    ("(" * 3000 + ")" * 3000, 3000),
])
def test_regex_depth(pattern: str, depth: int):
    assert regex_depth(pattern) == depth


def test_ebnf_and_json_depth_skip_literals_and_comments():
    assert ebnf_depth('root ::= ("(" | "[(") (a (b))  # ((( comment\nx ::= [(]') == 2
    assert ebnf_depth("root ::= '(((' ") == 0
    assert json_depth('{"a": [1, {"b": "[[{{"}]}') == 3
    assert json_depth('"\\"[[["') == 0


def test_the_first_grammar_over_a_limit_is_named():
    check_grammars({"sampling_params": {"regex": "(a)"}}, 10, 1)
    with pytest.raises(RequestError) as info:
        check_grammars({"sampling_params": [{"regex": "(a)"}, {"regex": "((a))"}]}, 10, 1)
    assert info.value.param == "sampling_params.regex" and "--max-grammar-depth" in info.value.message
    deep: list = []
    for _ in range(300):  # past orjson's own recursion limit: refused as too deep, not a crash
        deep = [deep]
    with pytest.raises(RequestError, match="--max-grammar-depth"):
        check_grammars({"response_format": {"type": "json_schema", "json_schema": {"schema": deep}}}, 10**6, 64)
