"""Bounds on the work one request may ask for, and the inputs a worker would crash on.

Checked by the parsers in two steps: a cheap one on counts, parallel samples (``check_samples``), grammar sizes
(``grammar_limits``) and text lengths *before* anything is tokenized (``check_count``, ``check_text``), and an
exact one on the token ids that will be prefilled
(``check_prompts``): how many prompts, how many tokens in all, every id inside the model's vocabulary.
SGLang 0.5.23 does not check ids against the vocabulary: an id past the embedding table raises
``IndexError`` in the scheduler, which takes the whole worker down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sgl_moe.router.errors import RequestError


@dataclass(frozen=True)
class RequestLimits:
    max_prompts: int = 1024
    """Prompts (batch entries, score items, decision questions) one request may carry."""
    max_request_tokens: int = 262_144
    """Prompt tokens one request may carry, summed over its prompts."""
    vocab_size: int = 0
    """Rows of the model's embedding table; ids must be below it (0: unknown, not checked)."""
    hidden_size: int = 0
    """Width of one ``input_embeds`` row (0: unknown, not checked)."""
    max_n: int = 64
    """Parallel samples (``n``, ``best_of``) one prompt may ask for; ``n`` x prompts is bounded by ``max_prompts``."""
    max_grammar_chars: int = 32_768
    """Characters of one constrained-decoding grammar (``grammar_limits``)."""
    max_grammar_depth: int = 64
    """Nesting depth of one constrained-decoding grammar (``grammar_limits``)."""
    chars_per_token: int = 0
    """The longest token of the router's tokenizer, in characters (``RouterTokenizer.max_token_chars``): a
    text longer than ``max_request_tokens × chars_per_token`` cannot fit and is refused without tokenizing
    it (0: not checked). The exact count is checked after tokenization."""

    def check_count(self, n: int, param: str) -> None:
        if n > self.max_prompts:
            raise RequestError(400, f"{param} has {n} entries; the router accepts at most {self.max_prompts} "
                                    f"prompts per request (--max-prompts): split the batch", param)

    def check_text(self, chars: int, param: str) -> None:
        """``chars``: characters of all the text this request will tokenize."""
        if self.chars_per_token and chars > self.max_request_tokens * self.chars_per_token:
            raise RequestError(400, f"{param} holds {chars} characters, more than the {self.max_request_tokens} "
                                    f"tokens per request the router accepts (--max-request-tokens) can encode",
                               param)

    def check_prompts(self, prompts: list[list[int]], param: str) -> None:
        self.check_count(len(prompts), param)
        total = sum(len(p) for p in prompts)
        if total > self.max_request_tokens:
            raise RequestError(400, f"the request's prompts hold {total} tokens; the router accepts at most "
                                    f"{self.max_request_tokens} per request (--max-request-tokens)", param)
        if self.vocab_size:
            for i, prompt in enumerate(prompts):
                if prompt and max(prompt) >= self.vocab_size:
                    bad = next(t for t in prompt if t >= self.vocab_size)
                    where = param if len(prompts) == 1 else f"{param}[{i}]"
                    raise RequestError(400, f"{where} holds token id {bad}, outside the model's vocabulary "
                                            f"(ids 0..{self.vocab_size - 1})", param)

    def check_ids(self, ids: list[int], param: str) -> None:
        """Token ids in other fields (logprob ids, label ids, logit bias keys): inside the vocabulary."""
        if self.vocab_size and ids and max(ids) >= self.vocab_size:
            bad = next(t for t in ids if t >= self.vocab_size)
            raise RequestError(400, f"{param} holds token id {bad}, outside the model's vocabulary "
                                    f"(ids 0..{self.vocab_size - 1})", param)


def check_samples(endpoint: str, body: dict, limits: RequestLimits) -> None:
    """``n`` (and ``best_of``, ``beam_width``) within ``--max-n``, and the sequences they make (``n`` per prompt,
    summed over the prompts) within ``--max-prompts``: SGLang expands every sample into a request of its own before
    anything checks it (``n`` = 100,000 held a worker for minutes). Cheap: nothing is tokenized."""
    params = body.get("sampling_params") if endpoint == "/generate" else body
    per_prompt = params if isinstance(params, list) else [params]
    names = {"/generate": ("n", "beam_width"), "/v1/completions": ("n", "best_of")}.get(endpoint, ("n",))
    samples, fan_out = 0, False
    for p in per_prompt:
        n = 1
        for name in names:
            value = p.get(name) if isinstance(p, dict) else None
            if value is None:
                continue
            param = name if params is body else f"sampling_params.{name}"
            if not _is_id(value) or value < 1:
                raise RequestError(400, f"{param} must be a positive integer, got {value!r}", param)
            if value > limits.max_n:
                raise RequestError(400, f"{param} is {value}; the router accepts at most {limits.max_n} parallel "
                                        "samples per prompt (--max-n)", param)
            n = max(n, value)
        samples += n
        fan_out = fan_out or n > 1
    if not fan_out:
        return  # one sequence per prompt: the prompt count itself is checked with the prompts (``check_count``)
    if not isinstance(params, list):
        samples *= prompt_count(endpoint, body)
    if samples > limits.max_prompts:
        param = "n" if endpoint != "/generate" else "sampling_params.n"
        raise RequestError(400, f"the request asks for {samples} sequences (n per prompt, over its prompts); the "
                                f"router accepts at most {limits.max_prompts} per request (--max-prompts)", param)


def prompt_count(endpoint: str, body: dict) -> int:
    """How many prompts a ``/generate`` or completions body carries, read from its shape (0 if malformed)."""
    if endpoint == "/v1/completions":
        prompt = body.get("prompt")
        return len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else 1
    if endpoint != "/generate":
        return 1
    for key in ("input_ids", "text", "input_embeds"):
        value = body.get(key)
        if value is None:
            continue
        if key == "text":
            return len(value) if isinstance(value, list) else 1
        if key == "input_ids":
            return len(value) if isinstance(value, list) and value and isinstance(value[0], list) else 1
        nested = isinstance(value, list) and value and isinstance(value[0], list) and value[0] \
            and isinstance(value[0][0], list)
        return len(value) if nested else 1
    return 1


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ids(value: Any, param: str) -> list[int]:
    """A list of token ids, or a list of such lists (one per prompt), flattened."""
    if not isinstance(value, list):
        raise RequestError(400, f"{param} must be a list of token ids", param)
    flat = [t for v in value for t in v] if value and all(isinstance(v, list) for v in value) else value
    if not all(_is_id(t) for t in flat):
        raise RequestError(400, f"{param} must hold non-negative integer token ids", param)
    return flat


def _bias_ids(value: Any, param: str) -> list[int]:
    """The token ids a ``logit_bias`` object (or a list of them, one per prompt) names as keys."""
    maps = value if isinstance(value, list) else [value]
    out: list[int] = []
    for m in maps:
        if m is None:
            continue
        if not isinstance(m, dict):
            raise RequestError(400, f"{param} must be an object mapping token ids to biases", param)
        for key in m:
            if not (isinstance(key, str) and key.isdigit() and key.isascii()):
                raise RequestError(400, f"{param} keys must be token ids written as decimal strings, got {key!r}",
                                   param)
            out.append(int(key))
    return out


def check_id_fields(body: dict, limits: RequestLimits) -> None:
    """Token ids a request names outside its prompt (SGLang indexes logits with them): inside the vocabulary."""
    for name in ("token_ids_logprob", "label_token_ids"):
        if body.get(name) is not None:
            limits.check_ids(_ids(body[name], name), name)
    if body.get("logit_bias") is not None:
        limits.check_ids(_bias_ids(body["logit_bias"], "logit_bias"), "logit_bias")
    params = body.get("sampling_params")
    for p in params if isinstance(params, list) else [params]:
        if isinstance(p, dict) and p.get("logit_bias") is not None:
            limits.check_ids(_bias_ids(p["logit_bias"], "sampling_params.logit_bias"), "sampling_params")
    num = body.get("top_logprobs_num")
    for n in num if isinstance(num, list) else [num]:
        if n is not None and limits.vocab_size and _is_id(n) and n > limits.vocab_size:
            raise RequestError(400, f"top_logprobs_num {n} exceeds the vocabulary size {limits.vocab_size}",
                               "top_logprobs_num")
