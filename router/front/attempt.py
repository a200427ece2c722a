"""What the router sends a worker for one client request: the body's bytes (serialised once, the router's ``rid``
last), the headers passed on, the fingerprint suspects are known by, and the ``rid`` to abort."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.request_ids import new_rid
from sgl_moe.router.placement.suspects import SuspectList
from sgl_moe.router.request.token_ids import TokenIds, as_list

PROXIED = ("/generate", "/v1/score", "/v1/decisions", "/v1/completions", "/v1/chat/completions")
"""The routes whose requests the router places and forwards to a worker."""
FORWARDED_HEADERS = ("x-data-parallel-rank",)
"""Client headers passed on to the worker (``authorization`` too, when the router itself has no keys)."""
RID_ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")
"""Routes whose body takes SGLang's ``rid``: the router sets it (when the client did not) so that it can abort
the request on the worker when the client goes away."""


@dataclass(init=False)
class Attempt:
    """What the router sends a worker for one client request (the same on a retry). Not frozen, though nothing
    changes one once made (a frozen dataclass's ``__init__`` costs about three times as much, once per request)."""

    endpoint: str
    body: bytes
    headers: dict[str, str]
    fields: dict[str, Any]
    """The body's fields without any ``rid`` (the ids as written by ``ParsedRequest.input_ids_json`` where given)."""
    abort_rid: str | None
    """The SGLang ``rid`` to abort on the worker if the client goes away (None: a batch, or no ``rid`` field;
    the worker then notices the closed connection itself)."""
    named: bool = False
    """``body`` ends with a ``rid`` that ``fields`` lacks."""

    def __init__(self, endpoint: str, body: bytes, headers: dict[str, str], fields: dict[str, Any],
                 abort_rid: str | None, named: bool = False) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.endpoint = endpoint
        self.body = body
        self.headers = headers
        self.fields = fields
        self.abort_rid = abort_rid
        self.named = named

    @functools.cached_property
    def unnamed(self) -> bytes:
        """The body without any ``rid`` (``body`` itself when there is none): what ``fingerprint`` hashes. Written
        when first asked for, as the fingerprint is."""
        return orjson.dumps(self.fields, default=as_list) if self.named else self.body

    @functools.cached_property
    def fingerprint(self) -> bytes:
        """``SuspectList.fingerprint`` of the route and the body without any ``rid`` (a resent request matches).
        Made when first asked for: only a request that meets a suspect list, a failure or another replica's
        placement needs it."""
        return SuspectList.fingerprint(self.endpoint, self.unnamed)

    @classmethod
    def of(cls, endpoint: str, body: dict[str, Any], client_headers: Mapping[str, str],
           pass_authorization: bool, input_ids_json: bytes | None = None) -> Attempt:
        """The attempt for a parsed ``body`` (its ``rid`` set in place when the router makes one).
        ``pass_authorization``: the router has no keys of its own, so the client's ``authorization`` goes on to
        the workers (which check it, if anyone does). ``input_ids_json``: the JSON text of ``body["input_ids"]``,
        already written (``ParsedRequest.input_ids_json``).

        Token ids the router encoded (``token_ids.TokenIds``) that ``input_ids_json`` does not cover (a batch, a score's
        items) are written as lists (orjson's ``default``).

        The bytes are written once, the ``rid`` last (where ``body["rid"] = ...`` puts it): appending it to the bytes
        already written copied the whole body three times (``Attempt.of`` at shared-2000: 5.1 -> 1.9 us)."""
        client_rid = body.pop("rid", None) if endpoint in RID_ENDPOINTS else None
        abort_rid = None
        if endpoint in RID_ENDPOINTS:
            if client_rid is None and single_prompt(endpoint, body):
                client_rid = abort_rid = f"sgl-moe-{new_rid()}"  # one length: SGLang aborts by rid prefix
            elif isinstance(client_rid, str):
                abort_rid = client_rid
        fields = body if input_ids_json is None else {**body, "input_ids": orjson.Fragment(input_ids_json)}
        if client_rid is None:
            data = orjson.dumps(fields, default=as_list)
        else:
            data = orjson.dumps({**fields, "rid": client_rid}, default=as_list)
            if fields is body:
                fields = dict(body)  # (without the rid set in ``body`` next)
            body["rid"] = client_rid
        headers = {"content-type": "application/json"}
        if pass_authorization and "authorization" in client_headers:
            headers["authorization"] = client_headers["authorization"]
        for h in FORWARDED_HEADERS:
            if h in client_headers:
                headers[h] = client_headers[h]
        return cls(endpoint, data, headers, fields, abort_rid, client_rid is not None)


def single_prompt(endpoint: str, body: dict[str, Any]) -> bool:
    """The body asks for one generation (SGLang then takes a string ``rid``; a batch needs one per prompt)."""
    if endpoint == "/v1/chat/completions":
        return True
    if endpoint == "/v1/completions":
        prompt = body.get("prompt")
        return isinstance(prompt, str) or (isinstance(prompt, (list, TokenIds)) and bool(prompt)
                                           and isinstance(prompt[0], int))
    if endpoint == "/generate":
        for key in ("input_ids", "text", "input_embeds"):
            value = body.get(key)
            if value is None:
                continue
            if key == "text":
                return isinstance(value, str)
            if key == "input_ids":
                return bool(value) and isinstance(value[0], int)
            return bool(value) and isinstance(value[0], list) and bool(value[0]) and not isinstance(value[0][0], list)
    return False


def worker_auth_headers(cfg: RouterConfig) -> dict[str, str]:
    """Headers on every request the router sends its workers: its client key, for workers started with SGLang's
    ``--api-key`` set to it."""
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
