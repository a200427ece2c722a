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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from sgl_moe.router.api_fields import ACCEPTED_FIELDS, CHAT, COMPLETIONS, DECISIONS, GENERATE, SCORE
from sgl_moe.router.router_tokenizer import ChatTemplateError, NoChatTemplate, RouterTokenizer

DEFAULT_MAX_NEW_TOKENS = 128
"""``SamplingParams.max_new_tokens`` when ``/generate`` omits it."""
DEFAULT_COMPLETION_MAX_TOKENS = 16
"""``CompletionRequest.max_tokens`` default."""
REASONING_TOGGLES = ("thinking", "enable_thinking")
"""Chat template kwargs SGLang may set to turn reasoning off (``serving_decisions._PARSER_TOGGLE_MODES``)."""
_MAX_TOKEN_ID = 2**32 - 1  # SGLang hashes ids as uint32
INPUT_MARGIN = 6
"""The scheduler refuses prompts of ``context_length - 6`` tokens or more: ``max_req_input_len`` is
``min(context_len - 1, kv_capacity - 1) - 5`` (``tp_worker.py``), checked by ``validate_input_length``."""


class RequestError(Exception):
    """Bad client input: answered with ``status`` (4xx); never counts as a worker failure."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass
class Namespace:
    """How SGLang namespaces the request's KV cache: only ``plain`` requests share plain block hashes."""

    lora_name: str | None = None
    cache_salt: str | None = None
    extra_key: str | None = None

    @property
    def plain(self) -> bool:
        return self.lora_name is None and self.cache_salt is None and self.extra_key is None


@dataclass
class ParsedRequest:
    endpoint: str
    body: dict
    """Body to forward: token ids in place of text where SGLang answers identically."""
    prompts: list[list[int]]
    """Every sequence the worker prefills, in token ids (score: one per item, as SGLang builds it)."""
    shared_prefix_len: int
    """Tokens all prompts share (their longest common prefix)."""
    namespace: Namespace
    prefill_only: bool
    """At most one token decoded per prompt (``max_new_tokens <= 1``, score, decisions)."""
    stream: bool
    max_new_tokens: int
    """Most tokens any prompt may decode (score and decisions: 0, as SGLang runs them)."""
    model: str | None
    """The model name the client gave, if any."""
    affinity: bool
    """False when the prompt ids cannot be known exactly; ``prompts`` is then a best estimate."""


def parse_request(endpoint: str, raw: bytes, *, tokenizer: RouterTokenizer, served_model_name: str,
                  context_length: int) -> ParsedRequest:
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
    parse = _PARSERS[endpoint]
    return parse(_Context(endpoint, body, tokenizer, served_model_name, context_length))


@dataclass
class _Context:
    endpoint: str
    body: dict
    tokenizer: RouterTokenizer
    served_model_name: str
    context_length: int

    def result(self, body: dict, prompts: list[list[int]], *, namespace: Namespace, max_new_tokens: int,
               stream: bool, model: str | None, affinity: bool) -> ParsedRequest:
        return ParsedRequest(
            endpoint=self.endpoint, body=body, prompts=prompts, shared_prefix_len=_common_prefix_len(prompts),
            namespace=namespace, prefill_only=max_new_tokens <= 1, stream=stream, max_new_tokens=max_new_tokens,
            model=model, affinity=affinity)


# ---------------------------------------------------------------------------------------------
# Endpoints


def _parse_generate(ctx: _Context) -> ParsedRequest:
    """``/generate``: ``GenerateReqInput`` (``io_struct.py``) as the tokenizer manager reads it."""
    body, tok = ctx.body, ctx.tokenizer
    text, input_ids, embeds = body.get("text"), body.get("input_ids"), body.get("input_embeds")
    if text is None and input_ids is None and embeds is None:
        raise RequestError(400, "Either text, input_ids or input_embeds should be provided.", "text")
    forward, affinity = body, True
    has_media = any(body.get(k) not in (None, []) for k in ("image_data", "video_data", "audio_data"))
    if input_ids is not None:  # SGLang prefers input_ids over text when both are given
        single, prompts = _id_prompts(input_ids, "input_ids")
    elif text is not None:
        single, texts = _text_prompts(text, "text")
        prompts = _encode_all(tok, texts, "text")
        if tok.exact and not has_media:
            forward = {k: v for k, v in body.items() if k != "text"}
            forward["input_ids"] = prompts[0] if single else prompts
        affinity = tok.exact
    else:  # input_embeds: the radix cache is off for these; only the lengths are known
        single, prompts = _embed_placeholders(embeds)
        affinity = False
    if has_media:
        affinity = False  # the multimodal processor expands placeholders into pad tokens
    n = len(prompts)
    params = _generate_sampling_params(body.get("sampling_params"), n)
    limits = [_max_new_tokens(p) for p in params]
    _check_context(prompts, [value if explicit else None for value, explicit in limits], ctx.context_length)
    max_new = max(_decode_bound(value, p, ctx.context_length) for (value, _), p in zip(limits, prompts))
    namespaces = _namespaces(body, n, single, lora=None)
    return ctx.result(forward, prompts, namespace=namespaces[0], max_new_tokens=max_new,
                      stream=_flag(body, "stream"), model=None, affinity=affinity and _same(namespaces))


def _parse_completions(ctx: _Context) -> ParsedRequest:
    """``/v1/completions``: ``OpenAIServingCompletion._convert_to_internal_request``."""
    body, tok = ctx.body, ctx.tokenizer
    model, adapter = _check_model(body, ctx.served_model_name)
    if "prompt" not in body:
        raise RequestError(400, "prompt is required", "prompt")
    prompt = body["prompt"]
    forward, affinity = body, True
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
        single, texts = _text_prompts(prompt, "prompt")
        prompts = _encode_all(tok, texts, "prompt")
        if tok.exact and not body.get("echo"):  # echo returns the prompt as the client wrote it
            forward = {**body, "prompt": prompts[0] if single else prompts}
        affinity = tok.exact
    else:
        single, prompts = _id_prompts(prompt, "prompt")
    max_tokens = body.get("max_tokens", DEFAULT_COMPLETION_MAX_TOKENS)
    if not _is_int(max_tokens) or max_tokens <= 0:
        raise RequestError(400, "max_tokens must be a positive integer", "max_tokens")
    _check_context(prompts, [max_tokens] * len(prompts), ctx.context_length)
    max_new = max(_decode_bound(max_tokens, p, ctx.context_length) for p in prompts)
    namespaces = _namespaces(body, len(prompts), single, lora=adapter)
    return ctx.result(forward, prompts, namespace=namespaces[0], max_new_tokens=max_new,
                      stream=_flag(body, "stream"), model=model, affinity=affinity and _same(namespaces))


def _parse_chat(ctx: _Context) -> ParsedRequest:
    """``/v1/chat/completions``: rendered with the tokenizer's chat template, encoded without specials.

    SGLang (``serving_chat.py: _apply_jinja_template``) renders the template to text and encodes it
    with ``add_special_tokens=False``; a last assistant message becomes a user message unless
    ``continue_final_message``. The body is forwarded unchanged: the response parsers read the
    messages. Affinity is claimed only for plain text conversations SGLang renders without extras.
    """
    body, tok = ctx.body, ctx.tokenizer
    model, adapter = _check_model(body, ctx.served_model_name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(400, f"messages[{i}] must be an object with a string role", "messages")
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 0):
            raise RequestError(400, f"{name} must be a non-negative integer", name)
    max_new = body.get("max_completion_tokens") or body.get("max_tokens")  # SGLang's `or`: 0 falls through
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError(400, "chat_template_kwargs must be an object", "chat_template_kwargs")
    if body.get("input_ids") is not None:  # SGLang then skips the template
        _, prompts = _id_prompts(body["input_ids"], "input_ids", batch=False)
        affinity = True
    else:
        prompt, affinity = _chat_prompt(tok, messages, body, kwargs)
        if not prompt:
            raise RequestError(400, "the chat prompt is empty", "messages")
        prompts = [prompt]
    _check_context(prompts, [max_new], ctx.context_length)
    namespace = _namespaces(body, 1, True, lora=adapter)[0]
    return ctx.result(body, prompts, namespace=namespace,
                      max_new_tokens=_decode_bound(max_new, prompts[0], ctx.context_length),
                      stream=_flag(body, "stream"), model=model, affinity=affinity)


def _parse_score(ctx: _Context) -> ParsedRequest:
    """``/v1/score``: ``TokenizerManagerScoreMixin.score_request`` without ``--enable-mis``.

    Text: each sequence is ``tokenizer(f"{query}{item}")`` (``f"{item}{query}"`` with
    ``item_first``), so BPE may merge across the boundary. Token ids: ``query + item`` (or
    ``item + query``). Forwarded as ids: an empty query and each full sequence as an item, which
    SGLang builds into the same sequences. A text query with token-id items is refused: SGLang would
    score the text ``query`` followed by the list's Python repr.
    """
    body, tok = ctx.body, ctx.tokenizer
    model, _ = _check_model(body, ctx.served_model_name)  # score ignores any LoRA adapter in model
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
    item_first = bool(body.get("item_first"))
    has_embeds = any(body.get(k) is not None for k in ("query_embed_overrides", "item_embed_overrides"))
    forward, affinity = body, not has_embeds
    if text_items and has_embeds:  # _batch_tokenize_query_and_items: separately, specials on the query only
        q = tok.encode(query)
        prompts = [_join(q, tok.encode_plain(i), item_first) for i in items]
    elif text_items:
        texts = [f"{i}{query}" if item_first else f"{query}{i}" for i in items]
        prompts = tok.encode_batch(texts)
        affinity = tok.exact
        if tok.exact and body.get("score_extraction_token") is None:
            forward = {**body, "query": [], "items": prompts}
    else:
        q = _token_ids(query, "query", allow_empty=True)
        prompts = [_join(q, _token_ids(i, f"items[{n}]", allow_empty=True), item_first)
                   for n, i in enumerate(items)]
    for n, p in enumerate(prompts):
        if not p:
            raise RequestError(400, f"query + items[{n}] is empty", "items")
    _check_context(prompts, [0] * len(prompts), ctx.context_length)
    return ctx.result(forward, prompts, namespace=Namespace(), max_new_tokens=0, stream=False, model=model,
                      affinity=affinity)


def _parse_decisions(ctx: _Context) -> ParsedRequest:
    """``/v1/decisions`` (``serving_decisions.py``, prompt format version 1).

    Each question is one user message rendered with the chat template (generation prompt added,
    reasoning toggled off, request ``chat_template_kwargs`` on top), encoded without specials, and
    scored with ``max_new_tokens`` 0 through ``score_prompts``. The body has no token-id form.
    """
    body, tok = ctx.body, ctx.tokenizer
    model, adapter = _check_model(body, ctx.served_model_name)
    if adapter is not None:
        raise RequestError(400, f"model names the LoRA adapter {adapter!r}, which {DECISIONS} does not support",
                           "model")
    if _is_blank(body.get("input")):
        raise RequestError(400, "input must not be blank", "input")
    questions = body.get("questions")
    if not isinstance(questions, list) or not questions:
        raise RequestError(400, "questions must be a non-empty list", "questions")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError(400, "chat_template_kwargs must be an object", "chat_template_kwargs")
    text = _render_text(body["input"])
    template = tok.chat_template or ""
    toggles = {name: False for name in REASONING_TOGGLES if name in template}
    affinity = tok.exact and tok.has_chat_template and not toggles and not body.get("images")
    prompts = []
    for n, question in enumerate(questions):
        content = _decision_question(text, question, f"questions[{n}]")
        try:
            rendered = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                               **{**toggles, **kwargs})
        except (NoChatTemplate, ChatTemplateError):
            rendered, affinity = content, False  # the worker answers; the estimate is the bare question
        prompts.append(tok.encode_plain(rendered))
    _check_context(prompts, [0] * len(prompts), ctx.context_length)
    return ctx.result(body, prompts, namespace=Namespace(), max_new_tokens=0, stream=False, model=model,
                      affinity=affinity)


_PARSERS = {
    GENERATE: _parse_generate,
    COMPLETIONS: _parse_completions,
    CHAT: _parse_chat,
    SCORE: _parse_score,
    DECISIONS: _parse_decisions,
}


# ---------------------------------------------------------------------------------------------
# Prompts


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(value: Any, param: str, *, allow_empty: bool = False) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(t) and 0 <= t <= _MAX_TOKEN_ID for t in value):
        raise RequestError(400, f"{param} must be a list of non-negative integer token ids", param)
    if not value and not allow_empty:
        raise RequestError(400, f"{param} is empty", param)
    return value


def _id_prompts(value: Any, param: str, *, batch: bool = True) -> tuple[bool, list[list[int]]]:
    """``(single, prompts)`` from a token-id list, or (when ``batch``) a list of them."""
    if not isinstance(value, list) or not value:
        raise RequestError(400, f"{param} must be a non-empty list of token ids", param)
    if batch and isinstance(value[0], list):
        return False, [_token_ids(p, f"{param}[{i}]") for i, p in enumerate(value)]
    return True, [_token_ids(value, param)]


def _text_prompts(value: Any, param: str) -> tuple[bool, list[str]]:
    """``(single, texts)`` from a string or a non-empty list of non-empty strings."""
    if isinstance(value, str):
        texts, single = [value], True
    elif isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        texts, single = value, False
    else:
        raise RequestError(400, f"{param} must be a string or a non-empty list of strings", param)
    for i, t in enumerate(texts):
        if not t:
            raise RequestError(400, f"{param} is empty" if single else f"{param}[{i}] is empty", param)
    return single, texts


def _encode_all(tok: RouterTokenizer, texts: list[str], param: str) -> list[list[int]]:
    prompts = tok.encode_batch(texts)
    for p in prompts:
        if not p:  # an empty prompt crashes the SGLang 0.5.23 scheduler (MoE reshape of 0 tokens)
            raise RequestError(400, f"{param} encodes to no tokens", param)
    return prompts


def _embed_placeholders(embeds: Any) -> tuple[bool, list[list[int]]]:
    """``(single, prompts)`` of zeros as long as ``input_embeds`` (one row per position)."""
    if not isinstance(embeds, list) or not embeds or not all(isinstance(e, list) and e for e in embeds):
        raise RequestError(400, "input_embeds must be a non-empty list of embeddings", "input_embeds")
    if not isinstance(embeds[0][0], list):
        return True, [[0] * len(embeds)]
    return False, [[0] * len(e) for e in embeds]


def _join(query: list[int], item: list[int], item_first: bool) -> list[int]:
    return item + query if item_first else query + item


def _common_prefix_len(prompts: list[list[int]]) -> int:
    first = prompts[0]
    n = len(first)
    for p in prompts[1:]:
        n = min(n, len(p))
        for i in range(n):
            if p[i] != first[i]:
                n = i
                break
    return n


def _chat_prompt(tok: RouterTokenizer, messages: list[dict], body: dict,
                 kwargs: dict[str, Any]) -> tuple[list[int], bool]:
    """The chat prompt ids and whether they are exact (else a best estimate).

    Exact only for messages of role, string content and name, without tools, reasoning options or
    ``continue_final_message``: SGLang validates those into its message models and hands the
    template their non-None fields (``ChatCompletionMessageUserParam`` keeps no ``name``), with a
    last assistant turn turned into a user turn (``_handle_last_assistant_message``). With
    ``continue_final_message`` the last assistant content is encoded after the generation prompt,
    BOS stripped; a reasoning parser may prepend to it, hence no exactness.
    """
    plain = all(set(m) <= {"role", "content", "name"} and isinstance(m.get("content"), (str, type(None)))
                for m in messages)
    exact = (tok.exact and plain and not body.get("tools") and not body.get("continue_final_message")
             and body.get("reasoning_effort") is None and body.get("reasoning") is None)
    rendered = [_template_message(m) for m in messages]
    prefix = None
    if rendered[-1]["role"] == "assistant" and isinstance(messages[-1].get("content"), str):
        if body.get("continue_final_message"):
            prefix = rendered.pop()["content"]
        else:
            rendered[-1] = {"role": "user", "content": rendered[-1]["content"]}
    try:
        text = tok.apply_chat_template(rendered, add_generation_prompt=True, **kwargs)
    except (NoChatTemplate, ChatTemplateError):
        text, exact = "\n".join(m["content"] for m in rendered), False
    ids = tok.encode_plain(text)
    if prefix:
        suffix = tok.encode(prefix)
        bos = tok.special_tokens.get("bos_token")
        if suffix and bos is not None and suffix[0] == tok.backend.token_to_id(bos):
            suffix = suffix[1:]
        ids += suffix
    return ids, exact


_GENERIC_MESSAGE_FIELDS = ("role", "content", "tool_call_id", "name", "phase", "reasoning_content", "tool_calls",
                           "tools", "prefix")
"""``ChatCompletionMessageGenericParam`` fields; a user message (``...UserParam``) has role and content only."""


def _template_message(message: dict) -> dict:
    """A message as SGLang hands it to the template: its model's non-None fields, content as text."""
    role = message["role"].lower()
    fields = ("role", "content") if role == "user" else _GENERIC_MESSAGE_FIELDS
    rendered = {k: message[k] for k in fields if message.get(k) is not None}
    rendered["role"] = role
    rendered["content"] = _flatten_content(message.get("content"))
    return rendered


def _flatten_content(content: Any) -> str:
    """Message content as text: text parts joined by spaces, as SGLang's string content format does."""
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                        and p.get("type") in ("text", "input_text"))
    return content if isinstance(content, str) else ""


# ---------------------------------------------------------------------------------------------
# Decision prompts (serving_decisions.py: render_text, render_question; PROMPT_FORMAT_VERSION 1)


def _is_blank(value: Any) -> bool:
    return not (value.strip() if isinstance(value, str) else value)


def _render_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _decision_question(text: str, question: Any, param: str) -> str:
    """The user message SGLang renders for one decision question."""
    if not isinstance(question, dict) or question.get("type") not in ("choice", "score", "yes_no"):
        raise RequestError(400, f"{param} must be an object with type choice, score or yes_no", param)
    kind = question["type"]
    if _is_blank(question.get("question")):
        raise RequestError(400, f"{param}.question must not be blank", param)
    question_text = _render_text(question["question"])
    if kind == "choice":
        options = question.get("options")
        if not isinstance(options, list) or not 2 <= len(options) <= 26 or not all(
                isinstance(o, dict) and isinstance(o.get("name"), str) for o in options):
            raise RequestError(400, f"{param}.options must list 2 to 26 options with names", param)
        lines = [f"Question: {question_text}"]
        for label, option in zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", options):
            detail = _render_text(option.get("description"))
            lines.append(f"{label}: {option['name']} - {detail}" if detail else f"{label}: {option['name']}")
        lines.append("Answer with the letter of one option only.")
    elif kind == "score":
        levels = question.get("levels")
        if not isinstance(levels, list) or not 2 <= len(levels) <= 10:
            raise RequestError(400, f"{param}.levels must list 2 to 10 levels", param)
        lines = [f"Question: {question_text}"]
        lines += [f"{label}: {_render_text(level)}" for label, level in enumerate(levels)]
        lines.append("Answer with the number of one level only.")
    else:
        lines = [f"Is the following true? {question_text}"]
        for label in ("yes", "no"):
            detail = _render_text(question.get(label))
            if detail:
                lines.append(f"{label}: {detail}")
        lines.append("Answer with yes or no only.")
    return "\n".join([text, "", *lines])


# ---------------------------------------------------------------------------------------------
# Model, namespace, lengths


def _check_model(body: dict, served_model_name: str) -> tuple[str | None, str | None]:
    """``(model, adapter)``; 404 unless ``model`` is the served name, optionally ``:adapter``.

    SGLang's completions, chat, score and decisions routes never check ``model``; its Responses API
    (``serving_responses.py: _validate_model``) and ``/v1/models/{model}`` answer 404 for an unknown
    one, splitting ``base:adapter`` as ``OpenAIServingBase._parse_model_parameter`` does. The served
    name is ``--served-model-name``, which defaults to the model path.
    """
    model = body.get("model")
    if model is None:
        return None, None
    if not isinstance(model, str):
        raise RequestError(400, "model must be a string", "model")
    if model == served_model_name:
        return model, None
    if model.startswith(f"{served_model_name}:"):
        return model, model[len(served_model_name) + 1:].strip() or None
    raise RequestError(404, f"The model '{model}' does not exist", "model")


def _per_prompt(body: dict, name: str, n: int, single: bool, *, allow_null_items: bool = False) -> list[str | None]:
    """A namespace field per prompt, normalized as ``GenerateReqInput`` does ("" means none)."""
    value = body.get(name)
    if value is None:
        return [None] * n
    if isinstance(value, str):
        return [value or None] * n
    if single or not isinstance(value, list):
        raise RequestError(400, f"{name} should be a string for a single request" if single
                           else f"{name} should be a list or a string", name)
    if len(value) != n:
        raise RequestError(400, f"The length of {name} should be equal to the batch size.", name)
    if not all(isinstance(v, str) or (allow_null_items and v is None) for v in value):
        raise RequestError(400, f"Every {name} should be a string.", name)
    return [v or None for v in value]


def _namespaces(body: dict, n: int, single: bool, *, lora: str | None) -> list[Namespace]:
    """One namespace per prompt; an adapter named in ``model`` overrides ``lora_path``."""
    loras = [lora] * n if lora is not None else _per_prompt(body, "lora_path", n, single, allow_null_items=True)
    salts = _per_prompt(body, "cache_salt", n, single)
    keys = _per_prompt(body, "extra_key", n, single)
    return [Namespace(*t) for t in zip(loras, salts, keys)]


def _same(namespaces: list[Namespace]) -> bool:
    return all(ns == namespaces[0] for ns in namespaces)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(400, f"{name} must be a boolean", name)
    return bool(value)


def _generate_sampling_params(value: Any, n: int) -> list[dict]:
    if value is None:
        return [{}] * n
    if isinstance(value, dict):
        return [value] * n
    if isinstance(value, list) and len(value) == n and all(isinstance(p, dict) for p in value):
        return value
    raise RequestError(400, "sampling_params must be an object, or a list with one object per prompt",
                       "sampling_params")


def _max_new_tokens(params: dict) -> tuple[int | None, bool]:
    """``(max_new_tokens, explicit)`` from ``/generate`` sampling params; None decodes as long as fits.

    Only an explicit value counts toward SGLang's prompt + max_new_tokens check (the tokenizer
    manager reads the raw dict); an absent one defaults to 128 afterwards.
    """
    if "max_new_tokens" not in params:
        return DEFAULT_MAX_NEW_TOKENS, False
    value = params["max_new_tokens"]
    if value is not None and (not _is_int(value) or value < 0):
        raise RequestError(400, f"max_new_tokens must be at least 0, got {value!r}.", "sampling_params")
    return value, value is not None


def _decode_bound(max_new_tokens: int | None, prompt: list[int], context_length: int) -> int:
    """Tokens the scheduler lets ``prompt`` decode: ``Scheduler.init_req_max_new_tokens`` caps them at
    ``max_req_len - len(prompt) - 1`` with ``max_req_len = context_length - 1``."""
    room = max(0, context_length - len(prompt) - 2)
    return room if max_new_tokens is None else min(max_new_tokens, room)


def _check_context(prompts: list[list[int]], max_new_tokens: list[int | None], context_length: int) -> None:
    """SGLang's length rules: the scheduler refuses prompts of ``context_length - INPUT_MARGIN`` tokens
    or more, and ``TokenizerManager._validate_one_request`` refuses prompt + an explicitly requested
    ``max_new_tokens`` above the context length."""
    limit = context_length - INPUT_MARGIN
    for prompt, max_new in zip(prompts, max_new_tokens):
        n = len(prompt)
        if n >= limit:
            raise RequestError(400, f"The input ({n} tokens) is too long: with a context length of "
                                    f"{context_length} tokens the worker accepts at most {limit - 1} prompt "
                                    f"tokens.")
        if max_new is not None and n + max_new > context_length:
            raise RequestError(400, f"Requested token count exceeds the model's maximum context length of "
                                    f"{context_length} tokens. You requested a total of {n + max_new} tokens: "
                                    f"{n} tokens from the input messages and {max_new} tokens for the "
                                    f"completion. Please reduce the number of tokens in the input messages or "
                                    f"the completion to fit within the limit.")
