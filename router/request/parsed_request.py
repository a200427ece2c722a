"""What the router knows of a request once it is parsed: the prompts in token ids and their KV namespace.

``request_parsing`` builds a ``ParsedRequest``; the service places and forwards it. The namespace
rules here are ``GenerateReqInput``'s: SGLang keys the radix cache on LoRA adapter, cache salt and
extra key, so only requests with none of them share plain block hashes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sgl_moe.router.errors import RequestError
from sgl_moe.router.request.prefix_memo import MemoPath, ids_json


@dataclass(frozen=True)
class Namespace:
    """How SGLang namespaces the request's KV cache: only ``plain`` requests share plain block hashes."""

    lora_name: str | None = None
    cache_salt: str | None = None
    extra_key: str | None = None

    @property
    def plain(self) -> bool:
        return self.lora_name is None and self.cache_salt is None and self.extra_key is None


PLAIN = Namespace()
"""The namespace of a prompt with no adapter, salt or extra key (shared: one less object per request)."""
_NONE = (None, None, None)


@dataclass(init=False)
class ParsedRequest:
    """(Not frozen, though nothing changes one once made: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, 1.9 us for these eleven against 0.7 us, once per request.)"""

    endpoint: str
    body: dict
    """Body to forward: token ids in place of text where SGLang answers identically."""
    prompts: list[list[int]]
    """Every sequence the worker prefills, in token ids (score: one per item, as SGLang builds it); those the prefix
    memo encoded are ``token_ids.TokenIds`` (packed uint32, equal to the list of the same ints)."""
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
    memo_paths: list[MemoPath] | None = None
    """For prompts encoded from text: the prefix-memo path of each (``PrefixMemo.page_hashes`` reuses the page
    hashes its nodes hold); None otherwise."""

    def __init__(self, endpoint: str, body: dict, prompts: list[list[int]], shared_prefix_len: int,
                 namespace: Namespace, prefill_only: bool, stream: bool, max_new_tokens: int, model: str | None,
                 affinity: bool, memo_paths: list[MemoPath] | None = None) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.endpoint = endpoint
        self.body = body
        self.prompts = prompts
        self.shared_prefix_len = shared_prefix_len
        self.namespace = namespace
        self.prefill_only = prefill_only
        self.stream = stream
        self.max_new_tokens = max_new_tokens
        self.model = model
        self.affinity = affinity
        self.memo_paths = memo_paths

    def input_ids_json(self) -> bytes | None:
        """The JSON text of ``body["input_ids"]`` when it is the one prompt the memo encoded (``prefix_memo.ids_json``:
        a shared prefix's part written once, packed ids written from their buffer), else None."""
        paths = self.memo_paths
        if not paths or len(paths) != 1 or self.body.get("input_ids") is not self.prompts[0]:
            return None
        return ids_json(paths[0], self.prompts[0])


def common_prefix_len(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with."""
    first = prompts[0]
    n = len(first)
    for p in prompts[1:]:
        n = min(n, len(p))
        for i in range(n):
            if p[i] != first[i]:
                n = i
                break
    return n


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


def namespaces(body: dict, n: int, single: bool, *, lora: str | None) -> list[Namespace]:
    """One namespace per prompt; an adapter named in ``model`` overrides ``lora_path``."""
    loras = [lora] * n if lora is not None else _per_prompt(body, "lora_path", n, single, allow_null_items=True)
    salts = _per_prompt(body, "cache_salt", n, single)
    keys = _per_prompt(body, "extra_key", n, single)
    return [PLAIN if t == _NONE else Namespace(*t) for t in zip(loras, salts, keys)]


def same_namespace(spaces: list[Namespace]) -> bool:
    """True when every prompt shares the first one's namespace (a batch then keeps its affinity)."""
    first = spaces[0]
    return all(ns is first or ns == first for ns in spaces)
