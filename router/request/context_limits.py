"""SGLang's length rules: which prompts a worker refuses, and how many tokens it lets each decode.

The router answers a prompt the worker would refuse with the same 400 itself, and bounds the
decode length it plans for by what the worker's scheduler will actually allow.
"""

from __future__ import annotations

from sgl_moe.router.errors import RequestError
from sgl_moe.router.request.request_fields import is_int

DEFAULT_MAX_NEW_TOKENS = 128
"""``SamplingParams.max_new_tokens`` when ``/generate`` omits it."""
DEFAULT_COMPLETION_MAX_TOKENS = 16
"""``CompletionRequest.max_tokens`` default."""
INPUT_MARGIN = 6
"""The scheduler refuses prompts of ``context_length - 6`` tokens or more: ``max_req_input_len`` is
``min(context_len - 1, kv_capacity - 1) - 5`` (``tp_worker.py``), checked by ``validate_input_length``."""


def max_new_tokens(params: dict) -> tuple[int | None, bool]:
    """``(max_new_tokens, explicit)`` from ``/generate`` sampling params; None decodes as long as fits.

    Only an explicit value counts toward SGLang's prompt + max_new_tokens check (the tokenizer
    manager reads the raw dict); an absent one defaults to 128 afterwards.
    """
    if "max_new_tokens" not in params:
        return DEFAULT_MAX_NEW_TOKENS, False
    value = params["max_new_tokens"]
    if value is not None and (not is_int(value) or value < 0):
        raise RequestError(400, f"max_new_tokens must be at least 0, got {value!r}.", "sampling_params")
    return value, value is not None


def decode_bound(max_new_tokens: int | None, prompt: list[int], context_length: int) -> int:
    """Tokens the scheduler lets ``prompt`` decode: ``Scheduler.init_req_max_new_tokens`` caps them at
    ``max_req_len - len(prompt) - 1`` with ``max_req_len = context_length - 1``."""
    room = max(0, context_length - len(prompt) - 2)
    return room if max_new_tokens is None else min(max_new_tokens, room)


def check_context(prompts: list[list[int]], max_new_tokens: list[int | None], context_length: int) -> None:
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
