"""Constrained-decoding grammars a request carries, bounded in size and nesting before a worker compiles them.

SGLang compiles ``regex``, ``json_schema``, ``ebnf`` and ``structural_tag`` (xgrammar) and ``stop_regex``
(Python ``re``) inside the worker before the request runs, and a hostile one costs the worker seconds: a regex of
3,000 nested groups held one for 11.8 s before SGLang refused it. The router refuses such a grammar first, with
400 naming the flag, from its length (``--max-grammar-chars``) and its deepest nesting (``--max-grammar-depth``:
groups of a regex, parentheses of an EBNF grammar, objects and arrays of a JSON schema). One linear scan each;
nothing is parsed or compiled here.
"""

from __future__ import annotations

from typing import Any

import orjson

from sgl_moe.router.errors import RequestError

REGEX_FIELDS = ("regex", "stop_regex")
EBNF_FIELDS = ("ebnf",)
JSON_FIELDS = ("json_schema", "structural_tag", "response_format")
"""Where grammars sit: ``sampling_params`` of ``/generate`` (one object or one per prompt) and the top level of
``/v1/completions`` and ``/v1/chat/completions`` (``response_format`` there only; a JSON schema may be an object)."""

GRAMMAR_FIELDS = (*REGEX_FIELDS, *EBNF_FIELDS, *JSON_FIELDS)


def check_grammars(body: dict, max_chars: int, max_depth: int) -> None:
    """Every grammar field of ``body`` within ``max_chars`` characters and ``max_depth`` levels of nesting."""
    params = body.get("sampling_params")
    places = [("", body)] + [("sampling_params.", p) for p in (params if isinstance(params, list) else [params])
                             if isinstance(p, dict)]
    for prefix, fields in places:
        for name in GRAMMAR_FIELDS:
            value = fields.get(name)
            if value is None:
                continue
            param = prefix + name
            try:
                texts = _texts(value)
            except orjson.JSONEncodeError:
                raise RequestError(400, f"{param} nests more than 254 levels deep; the router accepts grammars "
                                        f"nested at most {max_depth} levels (--max-grammar-depth)", param) from None
            for text in texts:
                if len(text) > max_chars:
                    raise RequestError(400, f"{param} holds {len(text)} characters; the router accepts grammars of at "
                                            f"most {max_chars} (--max-grammar-chars)", param)
                depth = (regex_depth(text) if name in REGEX_FIELDS else
                         ebnf_depth(text) if name in EBNF_FIELDS else json_depth(text))
                if depth > max_depth:
                    raise RequestError(400, f"{param} nests {depth} levels deep; the router accepts grammars nested "
                                            f"at most {max_depth} levels (--max-grammar-depth)", param)


def _texts(value: Any) -> list[str]:
    """A grammar field as the text(s) the worker compiles: a string, each string of a list (``stop_regex``), or
    an object written as JSON (a schema or ``response_format``)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return [orjson.dumps(value).decode()]  # JSONEncodeError past orjson's recursion limit (254 levels)


def regex_depth(pattern: str) -> int:
    """Deepest nesting of groups; escaped and bracketed parentheses do not count."""
    depth = deepest = 0
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":  # a character class: up to the first unescaped ']' after its first character
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":  # a ']' right after '[' or '[^' is literal
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def ebnf_depth(grammar: str) -> int:
    """Deepest nesting of parentheses outside quoted literals, character classes and ``#`` comments."""
    depth = deepest = 0
    i, n = 0, len(grammar)
    while i < n:
        ch = grammar[i]
        if ch in "\"'[":
            close = "]" if ch == "[" else ch
            i += 1
            while i < n and grammar[i] != close:
                i += 2 if grammar[i] == "\\" else 1
        elif ch == "#":
            while i < n and grammar[i] != "\n":
                i += 1
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def json_depth(text: str) -> int:
    """Deepest nesting of objects and arrays in JSON text, outside strings."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth = max(0, depth - 1)
        i += 1
    return deepest
