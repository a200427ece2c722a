"""``POST /v1/classify``: prefill-only tasks answered by ``/v1/score`` calls placed by the router.

Every task is validated and tokenized before anything is sent (a bad input anywhere answers 400 and no
work is done). Each unit (one prefill; multi-selection gives one per candidate) is then its own routed
request: it goes through the same placement, Θ admission, queue and retry as a client's ``/v1/score``,
so the siblings of a multi-selection co-locate on the worker that holds their shared prompt until it
saturates. A unit that fails at run time fails only its own task: the other results are still returned.

When the router's tokenizer is not exact (the probe found the worker's ids differ), prompts and chat
renderings go to ``/v1/score`` as text, which the worker tokenizes itself; labels keep the router's ids (short
plain strings, where loaders agree). The router never answers a 5xx of its own for want of exact ids.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from sgl_moe.router.errors import RequestError, error_body, error_response, request_error_response
from sgl_moe.router.front.attempt import Attempt
from sgl_moe.router.front.intake import read_body
from sgl_moe.router.front.prefill_tasks import ScorePlan, Task, TaskError, combine, parse_tasks, plan_score, read_score
from sgl_moe.router.front.request_ids import new_rid
from sgl_moe.router.request.chat_prompt import chat_prompt, template_message
from sgl_moe.router.request.parsed_request import ParsedRequest
from sgl_moe.router.request.request_fields import check_model
from sgl_moe.router.request.request_parsing import parse_request
from sgl_moe.router.request.router_tokenizer import ChatTemplateError, NoChatTemplate, RouterTokenizer

if TYPE_CHECKING:
    from sgl_moe.router.front.service import Router

log = logging.getLogger("sgl_moe.router.classify")

SCORE = "/v1/score"
UNITS_IN_FLIGHT = 256
"""Units of one call dispatched at once; the rest wait here, so one big batch cannot fill the router's queue."""


@dataclass(frozen=True)
class PlannedUnit:
    """One ``/v1/score`` call of a task, validated and tokenized before anything is sent."""

    task: Task
    plan: ScorePlan
    parsed: ParsedRequest
    prompt_tokens: int


def _unit_ids(task: Task, suffix: str, tok: RouterTokenizer) -> list[int]:
    """The token ids SGLang prefills for the unit, as ``/v1/score`` builds them from text."""
    if task.prompt is not None:
        return tok.encode(task.prompt + suffix)  # SGLang: tokenizer(f"{query}{item}"), specials added
    if task.input_ids is not None:
        return task.input_ids + (tok.encode_plain(suffix) if suffix else [])
    ids, _ = chat_prompt(tok, task.messages, {}, {})
    return ids + (tok.encode_plain(suffix) if suffix else [])


def _unit_text(task: Task, suffix: str, tok: RouterTokenizer) -> str | None:
    """The unit's prompt as the text ``/v1/score`` tokenizes (special tokens added), or None for a token-id task.

    A chat task is rendered with the template; the BOS that the rendering writes is dropped when the tokenizer adds
    it on its own, so that it is not there twice."""
    if task.prompt is not None:
        return task.prompt + suffix
    if task.messages is None:
        return None
    rendered = [template_message(m) for m in task.messages]
    try:
        text = tok.apply_chat_template(rendered, add_generation_prompt=True)
    except (NoChatTemplate, ChatTemplateError):  # as chat_prompt: the contents joined
        return "\n".join(m["content"] for m in rendered) + suffix
    bos = tok.special_tokens.get("bos_token")
    if bos and text.startswith(bos) and tok.encode("a")[:1] == tok.encode_plain(bos)[:1]:
        text = text[len(bos):]
    return text + suffix


def _label_ids(task: Task, labels: list[str], tok: RouterTokenizer, param: str) -> list[list[int]]:
    ids = [tok.encode_plain(label) for label in labels]
    if any(not i for i in ids):
        raise TaskError("a label encodes to no tokens", param)
    keys = [tuple(i[:1]) if task.scoring == "first_token" else tuple(i) for i in ids]
    if len(set(keys)) != len(keys):
        dup = next(labels[n] for n, k in enumerate(keys) if keys.index(k) != n)
        what = "first token" if task.scoring == "first_token" else "tokens"
        raise TaskError(f"label {dup!r} has the same {what} as another label; they cannot be told apart", param)
    return ids


def plan_units(router: Router, tasks: list[Task], model: str | None, batch: bool) -> list[list[PlannedUnit]]:
    """Tokenize and validate every unit of every task; raises TaskError or RequestError (nothing sent yet)."""
    pool = router.pool
    tok = pool.tokenizer
    out = []
    for task in tasks:
        where = f"inputs[{task.index}]" if batch else None
        units = []
        if task.messages is not None and not tok.has_chat_template:
            raise TaskError("this model has no chat template; send prompt or input_ids instead",
                            f"{where}.messages" if where else "messages")
        for unit in task.units():
            lparam = f"{where}.{'labels' if task.type == 'classify' else 'choices'}" if where else "labels"
            text = None if tok.exact else _unit_text(task, unit.suffix, tok)
            query = _unit_ids(task, unit.suffix, tok) if text is None else text
            plan = plan_score(query, _label_ids(task, unit.labels, tok, lparam), task.scoring, tok.decode)
            if model is not None:
                plan.body["model"] = model
            try:
                parsed = parse_request(SCORE, orjson.dumps(plan.body), tokenizer=tok, limits=pool.limits,
                                       served_model_name=pool.model_name, context_length=pool.context_length)
            except RequestError as exc:
                raise RequestError(exc.status, f"{where + ': ' if where else ''}{exc.message}",
                                   where or exc.param) from None
            tokens = len(query) if text is None else len(parsed.prompts[0])  # text: the router's estimate
            units.append(PlannedUnit(task, plan, parsed, tokens))
        out.append(units)
    return out


async def classify(router: Router, request: web.Request) -> web.Response:
    t0 = time.perf_counter()
    resp = await _classify(router, request)
    router.metrics.answered("/v1/classify", resp.status, time.perf_counter() - t0)
    return resp


async def _classify(router: Router, request: web.Request) -> web.Response:
    pool = router.pool
    if pool.tokenizer is None:
        return error_response(503, "no worker is registered yet", kind="unavailable")
    raw = await read_body(request, router.cfg)
    if isinstance(raw, web.Response):
        return raw
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return error_response(400, f"the request body is not valid JSON: {exc}")
    try:
        tasks, model, batch = parse_tasks(body)
        check_model({"model": model}, pool.model_name)
        pool.limits.check_count(len(tasks), "inputs")
        plan = functools.partial(plan_units, router, tasks, model, batch)
        planned = plan() if len(raw) <= router.cfg.parse_inline_bytes else await asyncio.to_thread(plan)
        pool.limits.check_count(sum(len(units) for units in planned), "inputs")
    except TaskError as exc:
        return error_response(400, exc.message, param=exc.param)
    except RequestError as exc:
        return request_error_response(exc)
    rid = request.headers.get("x-request-id") or new_rid()
    pass_authorization = router.cfg.api_key is None and router.cfg.admin_api_key is None
    gate = asyncio.Semaphore(UNITS_IN_FLIGHT)

    async def run_unit(unit: PlannedUnit, urid: str) -> tuple[int, dict]:
        attempt = Attempt.of(SCORE, unit.parsed.body, request.headers, pass_authorization)
        resp = router.refuse_suspect(urid, attempt)
        if resp is None:
            async with gate:
                resp = await router.run(urid, unit.parsed, lambda p: router.forwarder.forward(attempt, p),
                                        attempt)
        payload = orjson.loads(resp.body) if resp.body else {}
        if resp.status != 200:
            message = (payload.get("error") or {}).get("message") if isinstance(payload, dict) else None
            return resp.status, {"message": message or str(payload)[:300], "code": resp.status,
                                 "retry_after": resp.headers.get("Retry-After")}
        try:
            probs, lps = read_score(unit.plan, payload)
        except (ValueError, KeyError, TypeError) as exc:
            return 502, {"message": f"unreadable /v1/score answer: {exc}", "code": 502}
        return 200, {"probs": probs, "logprobs": lps, "worker": resp.headers.get("x-sgl-moe-worker")}

    jobs = [[run_unit(u, f"{rid}.{t}.{k}") for k, u in enumerate(units)] for t, units in enumerate(planned)]
    flat = await asyncio.gather(*(j for units in jobs for j in units))
    results, statuses, n = [], [], 0
    for task, units in zip(tasks, planned):
        answers = flat[n:n + len(units)]
        n += len(units)
        failed = next((a for a in answers if a[0] != 200), None)
        if failed is not None:
            err = {k: v for k, v in failed[1].items() if v is not None}
            results.append({"id": task.id, "type": task.type, "error": err})
            statuses.append(failed[0])
            continue
        result = combine(task, [(a[1]["probs"], a[1]["logprobs"]) for a in answers])
        result["prompt_tokens"] = sum(u.prompt_tokens for u in units)
        result["workers"] = [a[1]["worker"] for a in answers]
        results.append(result)
        statuses.append(200)
    usage = {"prompt_tokens": sum(u.prompt_tokens for units in planned for u in units),
             "score_requests": n}
    out = {"object": "classify", "model": model or pool.model_name, "results": results, "usage": usage}
    status = 200 if 200 in statuses else statuses[0]
    extra = {}
    if status == 429:
        extra["Retry-After"] = results[0]["error"].get("retry_after") or "1"
    if status != 200:
        out["error"] = error_body(status, results[0]["error"]["message"], kind="request_failed")
        log.warning("classify %s: every task failed (%s)", rid, out["error"]["message"])
    return web.Response(body=orjson.dumps(out), status=status, content_type="application/json", headers=extra)
