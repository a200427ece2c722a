"""Validate a client request and find the exact token ids an SGLang 0.5.23 worker will prefill.

``parse_request`` answers bad input with a ``RequestError`` (a 4xx, never a worker failure) and
otherwise returns a ``ParsedRequest``: the prompts in token ids (for block hashing), the KV-cache
namespace, the decode length, and the body to forward. Where SGLang accepts token ids and answers
identically, the forwarded body carries ids instead of text so the worker skips tokenization.

Unknown top-level fields are refused with 400 naming the field. SGLang itself is lax here: the
``/generate`` dataclass and the pydantic models of ``/v1/completions``, ``/v1/chat/completions``
and ``/v1/score`` keep pydantic's default ``extra="ignore"`` and drop unknown fields silently, so a
misspelt ``max_token`` quietly decodes 16 tokens; only ``DecisionRequest`` sets ``extra="forbid"``
(and then answers 400 with a Python file path in the message). The field sets are SGLang's
own (``api_fields``; ``tests/router/test_request_parsing.py`` checks them against SGLang so an upgrade
that changes them fails loudly), plus ``reasoning``, which ``ChatCompletionRequest.normalize_reasoning_inputs``
reads from the raw body although it is no field.

The router assumes the workers run without ``--enable-mis`` (multi-item scoring),
``--allow-auto-truncate``, ``--completion-template`` and a ``--chat-template`` other than the
tokenizer's own; all are SGLang's defaults and the ``sgl_moe`` launcher's.

This module holds one parser per endpoint; the checks they share are in ``request_fields``
(fields), ``context_limits`` (lengths) and ``parsed_request`` (namespaces), the prompt builders in
``chat_prompt`` and ``decision_prompt``.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from sgl_moe.router.errors import RequestError
from sgl_moe.router.request.api_fields import ACCEPTED_FIELDS, CHAT, COMPLETIONS, DECISIONS, GENERATE, SCORE
from sgl_moe.router.request.chat_prompt import chat_prompt
from sgl_moe.router.request.context_limits import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    check_context,
    decode_bound,
    max_new_tokens,
)
from sgl_moe.router.request.decision_prompt import decision_prompts, is_blank
from sgl_moe.router.request.grammar_limits import check_grammars
from sgl_moe.router.request.parsed_request import (
    PLAIN,
    Namespace,
    ParsedRequest,
    common_prefix_len,
    namespaces,
    same_namespace,
)
from sgl_moe.router.request.prefix_memo import MemoPath
from sgl_moe.router.request.request_fields import (
    check_model,
    embed_placeholders,
    encode_all,
    flag,
    generate_sampling_params,
    id_prompts,
    is_int,
    text_prompts,
    token_ids,
)
from sgl_moe.router.request.request_limits import RequestLimits, check_id_fields, check_samples
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

NO_CHAT_TEMPLATE = ("this model's tokenizer has no chat template (tokenizer.chat_template is not set), so "
                    "/v1/chat/completions cannot render messages; send input_ids, or a prompt to /v1/completions")
"""SGLang 0.5.23 answers such a chat request 400 (transformers' ValueError in ``apply_chat_template``,
``serving_base.handle_request``); the router answers the same status in its own shape without a round trip."""


def parse_request(endpoint: str, raw: bytes, *, tokenizer: RouterTokenizer, served_model_name: str,
                  context_length: int, limits: RequestLimits | None = None) -> ParsedRequest:
    """Validate ``raw`` for ``endpoint`` and compute what the worker will prefill; raises RequestError."""
    if endpoint not in ACCEPTED_FIELDS:
        raise RequestError(404, f"the router does not serve {endpoint}")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RequestError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - ACCEPTED_FIELDS[endpoint])
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise RequestError(400, f"unknown field{'s' if len(unknown) > 1 else ''} {names} for {endpoint}",
                           param=unknown[0])
    limits = limits or RequestLimits()
    check_id_fields(body, limits)
    if endpoint in (GENERATE, COMPLETIONS, CHAT):  # before any tokenizing: the cheap bounds on work
        check_samples(endpoint, body, limits)
        check_grammars(body, limits.max_grammar_chars, limits.max_grammar_depth)
    parse = _PARSERS[endpoint]
    return parse(_Context(endpoint, body, tokenizer, served_model_name, context_length, limits))


@dataclass(init=False)
class _Context:
    endpoint: str
    body: dict
    tokenizer: RouterTokenizer
    served_model_name: str
    context_length: int
    limits: RequestLimits

    def __init__(self, endpoint: str, body: dict, tokenizer: RouterTokenizer, served_model_name: str,
                 context_length: int, limits: RequestLimits) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.endpoint = endpoint
        self.body = body
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.context_length = context_length
        self.limits = limits

    def result(self, body: dict, prompts: list[list[int]], *, namespace: Namespace, max_new_tokens: int,
               stream: bool, model: str | None, affinity: bool,
               paths: list[MemoPath] | None = None) -> ParsedRequest:
        self.limits.check_prompts(prompts, PROMPT_PARAM[self.endpoint])
        return ParsedRequest(
            endpoint=self.endpoint, body=body, prompts=prompts, shared_prefix_len=common_prefix_len(prompts),
            namespace=namespace, prefill_only=max_new_tokens <= 1, stream=stream, max_new_tokens=max_new_tokens,
            model=model, affinity=affinity, memo_paths=paths)


def _parse_generate(ctx: _Context) -> ParsedRequest:
    """``/generate``: ``GenerateReqInput`` (``io_struct.py``) as the tokenizer manager reads it."""
    body, tok = ctx.body, ctx.tokenizer
    text, input_ids, embeds = body.get("text"), body.get("input_ids"), body.get("input_embeds")
    if text is None and input_ids is None and embeds is None:
        raise RequestError(400, "Either text, input_ids or input_embeds should be provided.", "text")
    forward, affinity, paths = body, True, None
    has_media = any(body.get(k) not in (None, []) for k in ("image_data", "video_data", "audio_data"))
    if input_ids is not None:  # SGLang prefers input_ids over text when both are given
        single, prompts = id_prompts(input_ids, "input_ids")
    elif text is not None:
        single, texts = text_prompts(text, "text")
        ctx.limits.check_count(len(texts), "text")
        ctx.limits.check_text(sum(map(len, texts)), "text")
        prompts, paths = encode_all(tok, texts, "text")
        if tok.exact and not has_media:
            forward = {k: v for k, v in body.items() if k != "text"}
            forward["input_ids"] = prompts[0] if single else prompts
        affinity = tok.exact
    else:  # input_embeds: the radix cache is off for these; only the lengths are known
        single, prompts = embed_placeholders(embeds, ctx.limits.hidden_size)
        affinity = False
    if has_media:
        affinity = False  # the multimodal processor expands placeholders into pad tokens
    n = len(prompts)
    params = generate_sampling_params(body.get("sampling_params"), n)
    limits = [max_new_tokens(p) for p in params]
    check_context(prompts, [value if explicit else None for value, explicit in limits], ctx.context_length)
    max_new = max(decode_bound(value, p, ctx.context_length) for (value, _), p in zip(limits, prompts))
    spaces = namespaces(body, n, single, lora=None)
    return ctx.result(forward, prompts, namespace=spaces[0], max_new_tokens=max_new,
                      stream=flag(body, "stream"), model=None, affinity=affinity and same_namespace(spaces),
                      paths=paths)


def _parse_completions(ctx: _Context) -> ParsedRequest:
    """``/v1/completions``: ``OpenAIServingCompletion._convert_to_internal_request``."""
    body, tok = ctx.body, ctx.tokenizer
    model, adapter = check_model(body, ctx.served_model_name)
    if "prompt" not in body:
        raise RequestError(400, "prompt is required", "prompt")
    prompt = body["prompt"]
    forward, affinity, paths = body, True, None
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
        single, texts = text_prompts(prompt, "prompt")
        ctx.limits.check_count(len(texts), "prompt")
        ctx.limits.check_text(sum(map(len, texts)), "prompt")
        prompts, paths = encode_all(tok, texts, "prompt")
        if tok.exact and not body.get("echo"):  # echo returns the prompt as the client wrote it
            forward = {**body, "prompt": prompts[0] if single else prompts}
        affinity = tok.exact
    else:
        single, prompts = id_prompts(prompt, "prompt")
    max_tokens = body.get("max_tokens", DEFAULT_COMPLETION_MAX_TOKENS)
    if not is_int(max_tokens) or max_tokens <= 0:
        raise RequestError(400, "max_tokens must be a positive integer", "max_tokens")
    check_context(prompts, [max_tokens] * len(prompts), ctx.context_length)
    max_new = max(decode_bound(max_tokens, p, ctx.context_length) for p in prompts)
    spaces = namespaces(body, len(prompts), single, lora=adapter)
    return ctx.result(forward, prompts, namespace=spaces[0], max_new_tokens=max_new,
                      stream=flag(body, "stream"), model=model, affinity=affinity and same_namespace(spaces),
                      paths=paths)


def _parse_chat(ctx: _Context) -> ParsedRequest:
    """``/v1/chat/completions``: rendered with the tokenizer's chat template, encoded without specials.

    SGLang (``serving_chat.py: _apply_jinja_template``) renders the template to text and encodes it
    with ``add_special_tokens=False``; a last assistant message becomes a user message unless
    ``continue_final_message``. The body is forwarded unchanged: the response parsers read the
    messages. Affinity is claimed only for plain text conversations SGLang renders without extras.
    """
    body, tok = ctx.body, ctx.tokenizer
    model, adapter = check_model(body, ctx.served_model_name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(400, f"messages[{i}] must be an object with a string role", "messages")
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None and (not is_int(value) or value < 0):
            raise RequestError(400, f"{name} must be a non-negative integer", name)
    max_new = body.get("max_completion_tokens") or body.get("max_tokens")  # SGLang's `or`: 0 falls through
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError(400, "chat_template_kwargs must be an object", "chat_template_kwargs")
    if body.get("input_ids") is not None:  # SGLang then skips the template
        _, prompts = id_prompts(body["input_ids"], "input_ids", batch=False)
        affinity = True
    elif not tok.has_chat_template:
        raise RequestError(400, NO_CHAT_TEMPLATE, "messages")
    else:
        ctx.limits.check_text(len(orjson.dumps(messages)), "messages")
        prompt, affinity = chat_prompt(tok, messages, body, kwargs)
        if not prompt:
            raise RequestError(400, "the chat prompt is empty", "messages")
        prompts = [prompt]
    check_context(prompts, [max_new], ctx.context_length)
    namespace = namespaces(body, 1, True, lora=adapter)[0]
    return ctx.result(body, prompts, namespace=namespace,
                      max_new_tokens=decode_bound(max_new, prompts[0], ctx.context_length),
                      stream=flag(body, "stream"), model=model, affinity=affinity)


def _parse_score(ctx: _Context) -> ParsedRequest:
    """``/v1/score``: ``TokenizerManagerScoreMixin.score_request`` without ``--enable-mis``.

    Text: each sequence is ``tokenizer(f"{query}{item}")`` (``f"{item}{query}"`` with
    ``item_first``), so BPE may merge across the boundary. Token ids: ``query + item`` (or
    ``item + query``). Forwarded as ids: an empty query and each full sequence as an item, which
    SGLang builds into the same sequences. A text query with token-id items is refused: SGLang would
    score the text ``query`` followed by the list's Python repr.
    """
    body, tok = ctx.body, ctx.tokenizer
    model, _ = check_model(body, ctx.served_model_name)  # score ignores any LoRA adapter in model
    query, items = body.get("query"), body.get("items")
    if items is None:
        raise RequestError(400, "items must be provided", "items")
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not items:
        raise RequestError(400, "items must be a non-empty string or list", "items")
    text_items = all(isinstance(i, str) for i in items)
    if not text_items and not all(isinstance(i, list) for i in items):
        raise RequestError(400, "items must be all strings or all token id lists", "items")
    if query is None:
        query = "" if text_items else []
    if isinstance(query, str) != text_items:
        raise RequestError(400, "query and items must both be text or both be token ids", "query")
    ctx.limits.check_count(len(items), "items")
    if text_items:
        ctx.limits.check_text(len(query) * len(items) + sum(map(len, items)), "items")
    item_first = bool(body.get("item_first"))
    has_embeds = any(body.get(k) is not None for k in ("query_embed_overrides", "item_embed_overrides"))
    forward, affinity, paths = body, not has_embeds, None
    if text_items and has_embeds:  # _batch_tokenize_query_and_items: separately, specials on the query only
        q = tok.encode(query)
        prompts = [_join(q, tok.encode_plain(i), item_first) for i in items]
    elif text_items:
        texts = [f"{i}{query}" if item_first else f"{query}{i}" for i in items]
        prompts, paths = tok.encode_with_paths(texts)
        affinity = tok.exact
        if tok.exact and body.get("score_extraction_token") is None:
            forward = {**body, "query": [], "items": prompts}
    else:
        q = token_ids(query, "query", allow_empty=True)
        prompts = [_join(q, token_ids(i, f"items[{n}]", allow_empty=True), item_first)
                   for n, i in enumerate(items)]
    for n, p in enumerate(prompts):
        if not p:
            raise RequestError(400, f"query + items[{n}] is empty", "items")
    check_context(prompts, [0] * len(prompts), ctx.context_length)
    return ctx.result(forward, prompts, namespace=PLAIN, max_new_tokens=0, stream=False, model=model,
                      affinity=affinity, paths=paths)


def _parse_decisions(ctx: _Context) -> ParsedRequest:
    """``/v1/decisions`` (``serving_decisions.py``, prompt format version 1).

    Each question is one user message rendered with the chat template (generation prompt added,
    reasoning toggled off, request ``chat_template_kwargs`` on top), encoded without specials, and
    scored with ``max_new_tokens`` 0 through ``score_prompts``. The body has no token-id form.
    """
    body, tok = ctx.body, ctx.tokenizer
    model, adapter = check_model(body, ctx.served_model_name)
    if adapter is not None:
        raise RequestError(400, f"model names the LoRA adapter {adapter!r}, which {DECISIONS} does not support",
                           "model")
    if is_blank(body.get("input")):
        raise RequestError(400, "input must not be blank", "input")
    questions = body.get("questions")
    if not isinstance(questions, list) or not questions:
        raise RequestError(400, "questions must be a non-empty list", "questions")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError(400, "chat_template_kwargs must be an object", "chat_template_kwargs")
    ctx.limits.check_count(len(questions), "questions")
    ctx.limits.check_text(len(orjson.dumps(body["input"])) * len(questions) + len(orjson.dumps(questions)), "input")
    prompts, exact = decision_prompts(tok, body["input"], questions, kwargs)
    affinity = exact and not body.get("images")
    check_context(prompts, [0] * len(prompts), ctx.context_length)
    return ctx.result(body, prompts, namespace=PLAIN, max_new_tokens=0, stream=False, model=model,
                      affinity=affinity)


PROMPT_PARAM = {GENERATE: "input_ids", COMPLETIONS: "prompt", CHAT: "messages", SCORE: "items", DECISIONS: "questions"}
"""The field a limit on an endpoint's prompts names."""

_PARSERS = {
    GENERATE: _parse_generate,
    COMPLETIONS: _parse_completions,
    CHAT: _parse_chat,
    SCORE: _parse_score,
    DECISIONS: _parse_decisions,
}


def _join(query: list[int], item: list[int], item_first: bool) -> list[int]:
    return item + query if item_first else query + item
