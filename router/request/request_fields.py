"""Checks of single request fields shared by the endpoint parsers: prompts, token ids, flags, model.

Each check returns the field in the form the parsers use or raises ``RequestError`` (400, or 404 for
an unknown model) naming the field in ``param``; messages follow SGLang's where it has one.
"""

from __future__ import annotations

from typing import Any

from sgl_moe.router.errors import RequestError
from sgl_moe.router.request.prefix_memo import MemoPath
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

MAX_TOKEN_ID = 2**32 - 1
"""SGLang hashes token ids as uint32."""


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON ``true`` must not pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def token_ids(value: Any, param: str, *, allow_empty: bool = False) -> list[int]:
    """A list of token ids, each in SGLang's uint32 range."""
    if not isinstance(value, list) or not all(is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in value):
        raise RequestError(400, f"{param} must be a list of non-negative integer token ids", param)
    if not value and not allow_empty:
        raise RequestError(400, f"{param} is empty", param)
    return value


def id_prompts(value: Any, param: str, *, batch: bool = True) -> tuple[bool, list[list[int]]]:
    """``(single, prompts)`` from a token-id list, or (when ``batch``) a list of them."""
    if not isinstance(value, list) or not value:
        raise RequestError(400, f"{param} must be a non-empty list of token ids", param)
    if batch and isinstance(value[0], list):
        return False, [token_ids(p, f"{param}[{i}]") for i, p in enumerate(value)]
    return True, [token_ids(value, param)]


def text_prompts(value: Any, param: str) -> tuple[bool, list[str]]:
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


def encode_all(tok: RouterTokenizer, texts: list[str], param: str) -> tuple[list[list[int]], list[MemoPath]]:
    """``texts`` encoded as ``/generate`` encodes them, and the prefix-memo path of each; none may encode to
    nothing."""
    prompts, paths = tok.encode_with_paths(texts)
    for p in prompts:
        if not p:  # an empty prompt crashes the SGLang 0.5.23 scheduler (MoE reshape of 0 tokens)
            raise RequestError(400, f"{param} encodes to no tokens", param)
    return prompts, paths


def embed_placeholders(embeds: Any, hidden_size: int = 0) -> tuple[bool, list[list[int]]]:
    """``(single, prompts)`` of zeros as long as ``input_embeds`` (one row per position).

    Every row must be a list of ``hidden_size`` numbers (when known): a row of another width, or a ragged or
    non-numeric one, fails inside the worker's forward pass.
    """
    if not isinstance(embeds, list) or not embeds or not all(isinstance(e, list) and e for e in embeds):
        raise RequestError(400, "input_embeds must be a non-empty list of embeddings", "input_embeds")
    single = not isinstance(embeds[0][0], list)
    batch = [embeds] if single else embeds
    for i, prompt in enumerate(batch):
        if not isinstance(prompt, list) or not prompt:
            raise RequestError(400, f"input_embeds[{i}] must be a non-empty list of embeddings", "input_embeds")
        for row in prompt:
            if not isinstance(row, list) or not row or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in row):
                raise RequestError(400, "input_embeds rows must be non-empty lists of numbers", "input_embeds")
            if hidden_size and len(row) != hidden_size:
                raise RequestError(400, f"input_embeds rows must have the model's hidden size {hidden_size}, "
                                        f"got a row of {len(row)}", "input_embeds")
    return single, [[0] * len(p) for p in batch]


def flag(body: dict, name: str) -> bool:
    """An optional boolean field; absent or null is False."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(400, f"{name} must be a boolean", name)
    return bool(value)


def generate_sampling_params(value: Any, n: int) -> list[dict]:
    """``/generate``'s ``sampling_params``, one dict per prompt."""
    if value is None:
        return [{}] * n
    if isinstance(value, dict):
        return [value] * n
    if isinstance(value, list) and len(value) == n and all(isinstance(p, dict) for p in value):
        return value
    raise RequestError(400, "sampling_params must be an object, or a list with one object per prompt",
                       "sampling_params")


def check_model(body: dict, served_model_name: str) -> tuple[str | None, str | None]:
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
