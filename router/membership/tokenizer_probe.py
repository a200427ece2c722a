"""Verify, don't assume: the router's token ids against a joining worker's own, on a fixed probe set.

The router loads the worker's tokenizer files as SGLang loads them (``router_tokenizer``), but a loader it
does not mirror (remote code, ``--tokenizer-mode``, a patched tokenizer) would make its ids differ silently,
and every prefix-affinity decision with them. So when a worker joins, the pool asks the worker to tokenize
``PROBE_TEXTS`` (plus the tokenizer's own special tokens written as text) through SGLang's ``POST /v1/tokenize``
(``prompt`` a list, ``add_special_tokens`` true: the ids ``/generate`` prefills for text) and, when the router
has a chat template, ``PROBE_MESSAGES`` (``messages``: rendered as for a chat completion, the ids SGLang
prefills for ``/v1/chat/completions``). Two requests, sent together, with a timeout.

States: ``match`` (affinity stays on), ``mismatch`` (the pool marks the tokenizer inexact: text is forwarded
unchanged and placed least-loaded), ``unavailable`` (no ``/v1/tokenize`` or the call failed: the tokenizer
stays exact as loaded, unverified).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp

from sgl_moe.router.request.chat_prompt import chat_prompt
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

TOKENIZE_PATH = "/v1/tokenize"
PROBE_TIMEOUT_S = 10.0
"""Per probe request; a worker slower than this is ``unavailable`` (and still joins)."""

_LONG_SENTENCES = (
    "The cache stores key and value tensors for every token it has seen, page by page.",
    "In 2024, throughput rose 3.7x (from 1,250 to 4,625 tokens/s) after batching was fixed!",
    "Naïve routers ignore prefixes; smart ones — like this one — hash 16-token blocks.",
    "Ask: “why?” Answer: because re-computing a 32k-token prompt costs ~0.8 s on an H100.",
    "URLs such as https://example.com/a?b=c&d=e#f and e-mail like ops@example.org split oddly.",
)
LONG_TEXT = " ".join(_LONG_SENTENCES[i % len(_LONG_SENTENCES)] + f" ({i})" for i in range(130))
"""About 2,000 words of varied prose, numbers, punctuation and URLs."""

PROBE_TEXTS: tuple[tuple[str, str], ...] = (
    ("ascii", "Hello, world! The quick brown fox jumps over the lazy dog."),
    ("cjk", "你好，世界。東京は日本の首都です。서울은 한국의 수도입니다。"),
    ("emoji", "Launch 🚀 done ✅ — family 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, skin tone 👍🏽."),
    ("accents", "Café naïve façade Ångström jalapeño Straße œuvre Ελληνικά Кириллица"),
    ("whitespace", "  leading\tand\t\ttabs   runs      of spaces\n\n\nnewlines\r\n  trailing   "),
    ("code", 'def f(x: int) -> dict[str, int]:\n    """Doc."""\n    return {"x": x ** 2}  # sq\n\n'
             "for (int i = 0; i < n; ++i) { a[i] += b[i] >> 1; }\n"),
    ("long", LONG_TEXT),
)
"""(name, text) pairs sent as ``/generate`` text would be."""

PROBE_MESSAGES: list[dict[str, str]] = [
    {"role": "system", "content": "You are terse. Répondez en français si demandé."},
    {"role": "user", "content": "Summarise:\n\tfirst 🚀\n  second — 你好"},
    {"role": "assistant", "content": "First and second."},
    {"role": "user", "content": "Again, as code: `print('ok')`"},
]
"""A plain conversation (role and string content only), which the router renders exactly."""

CHAT_PROBE = "chat"


@dataclass(frozen=True)
class TokenizerCheck:
    """The outcome of one worker's probe, as ``GET /workers`` shows it (``tokenizer_check``)."""

    state: str
    """``match``, ``mismatch`` or ``unavailable``."""
    probes: int
    """Probes compared (0 when unavailable)."""
    first_difference: dict[str, Any] | None = None
    """Mismatch: ``probe``, ``position`` and both ids there (None past an end)."""
    detail: str = ""
    """Why unavailable; what was not compared (e.g. the chat probe)."""

    def describe(self) -> dict[str, Any]:
        return {"state": self.state, "probes": self.probes, "first_difference": self.first_difference,
                "detail": self.detail}


def probe_texts(tok: RouterTokenizer) -> list[tuple[str, str]]:
    """``PROBE_TEXTS`` plus the tokenizer's own named special tokens written into text."""
    specials = sorted(set(tok.special_tokens.values()))
    extra = [("special_tokens", "x " + " mid ".join(specials) + " end")] if specials else []
    return [*PROBE_TEXTS, *extra]


def router_ids(tok: RouterTokenizer) -> tuple[list[tuple[str, str]], list[list[int]], list[int] | None]:
    """The probes, the router's ids for each text, and its chat prompt ids (None without a chat template).
    Pure CPU work (the long probe takes milliseconds): the caller runs it in a thread."""
    texts = probe_texts(tok)
    ids = tok.encode_batch([t for _, t in texts])
    chat = chat_prompt(tok, PROBE_MESSAGES, {}, {})[0] if tok.has_chat_template else None
    return texts, ids, chat


def first_difference(name: str, mine: list[int], theirs: list[int]) -> dict[str, Any] | None:
    """Where two id lists first differ, or None when equal."""
    if mine == theirs:
        return None
    pos = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs)))
    return {"probe": name, "position": pos, "router_id": mine[pos] if pos < len(mine) else None,
            "worker_id": theirs[pos] if pos < len(theirs) else None,
            "router_len": len(mine), "worker_len": len(theirs)}


class ProbeUnavailable(Exception):
    """The worker did not answer a probe request usably."""


async def _tokenize(session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout: float) -> Any:
    try:
        async with session.post(url + TOKENIZE_PATH, json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                raise ProbeUnavailable(f"POST {TOKENIZE_PATH} answered {resp.status}")
            data = await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        raise ProbeUnavailable(f"POST {TOKENIZE_PATH} failed: {type(exc).__name__}: {exc}") from None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list):
        raise ProbeUnavailable(f"POST {TOKENIZE_PATH} answered no token list")
    return tokens


async def check_worker(session: aiohttp.ClientSession, url: str, tok: RouterTokenizer,
                       timeout: float = PROBE_TIMEOUT_S) -> TokenizerCheck:
    """Compare ``tok``'s ids with the worker's own on the probe set (two concurrent HTTP round trips)."""
    texts, mine, chat = await asyncio.to_thread(router_ids, tok)
    text_req = _tokenize(session, url, {"prompt": [t for _, t in texts], "add_special_tokens": True}, timeout)
    chat_req = _tokenize(session, url, {"messages": PROBE_MESSAGES}, timeout) if chat is not None else None
    results = await asyncio.gather(text_req, *([chat_req] if chat_req else []), return_exceptions=True)
    if isinstance(results[0], BaseException):
        if isinstance(results[0], ProbeUnavailable):
            return TokenizerCheck("unavailable", 0, detail=str(results[0]))
        raise results[0]
    theirs = results[0]
    if len(theirs) != len(texts) or not all(isinstance(x, list) for x in theirs):
        return TokenizerCheck("unavailable", 0, detail=f"POST {TOKENIZE_PATH} answered {len(theirs)} lists "
                                                       f"for {len(texts)} prompts")
    pairs = [(name, m, t) for (name, _), m, t in zip(texts, mine, theirs, strict=True)]
    detail = "" if chat is not None else "chat probe skipped: the router's tokenizer has no chat template"
    if chat is not None:
        if isinstance(results[1], ProbeUnavailable):
            detail = f"chat probe skipped: {results[1]}"
        elif isinstance(results[1], BaseException):
            raise results[1]
        else:
            pairs.append((CHAT_PROBE, chat, results[1]))
    for name, m, t in pairs:
        if (diff := first_difference(name, m, t)) is not None:
            return TokenizerCheck("mismatch", len(pairs), diff, detail)
    return TokenizerCheck("match", len(pairs), None, detail)
