"""Prefill-only tasks (seed 000 §3.1) as SGLang ``/v1/score`` calls: what ``POST /v1/classify`` accepts.

* **classify**: a prompt and candidate labels; one probability per label from one prefill.
* **choice**: candidates get identifiers (A, B, ...) listed in the prompt; the answer is the identifier whose
  token is most probable (one prefill).
* **multi**: k candidates become k binary sibling prefills ("does candidate i apply?") that share the prompt
  as prefix; each is placed by the router like any other request, so they co-locate until saturation.

Labels of several tokens are scored whole by default (``label_scoring="full"``): P(label) is the product
of P(t_k | prompt, t_1..t_{k-1}), read from one ``/v1/score`` call whose items are the label prefixes
(the prompt is their shared query, so it is computed once). ``"first_token"`` scores only each label's
first token (cheaper for long labels; first tokens must differ). Probabilities over candidates are the
softmax of the label log-probabilities, i.e. exactly what ``/v1/score`` with ``apply_softmax`` returns
when every label is one token (the router then forwards SGLang's numbers unchanged).

This module is pure: parsing, expansion into units, and combination of score results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHOICE_IDS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
MULTI_LABELS = (" yes", " no")
TASK_TYPES = ("classify", "choice", "multi")
SCORINGS = ("full", "first_token")
TASK_FIELDS = frozenset({"type", "prompt", "input_ids", "messages", "labels", "choices", "ids", "threshold",
                         "label_scoring", "id"})
BATCH_FIELDS = frozenset({"model", "inputs"})
MAX_LABELS = 64
MAX_MULTI_CHOICES = 256
MAX_INPUTS = 4096


class TaskError(Exception):
    """Invalid task input; ``param`` names the offending field (``inputs[3].labels``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def choice_prompt(prompt: str, choices: list[str], ids: list[str]) -> str:
    """The single-choice rendering: the question, one line per identified candidate, then ``Answer:``."""
    return prompt + "\n" + "".join(f"{i}. {c}\n" for i, c in zip(ids, choices)) + "Answer:"


def multi_suffix(choice: str) -> str:
    """What follows the shared prompt in the binary sibling for one candidate."""
    return f"\nCandidate: {choice}\nDoes the candidate apply? Answer:"


@dataclass
class UnitText:
    """One atomic prefill call in text form (for clients that send ``/generate`` themselves)."""

    prompt: str
    labels: list[str]


@dataclass
class Unit:
    """One atomic prefill: the prompt (text, token ids or chat messages) plus a text suffix, and its labels."""

    suffix: str
    labels: list[str]


@dataclass
class Task:
    index: int
    id: Any
    type: str
    prompt: str | None = None
    input_ids: list[int] | None = None
    messages: list[dict] | None = None
    labels: list[str] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    threshold: float = 0.5
    scoring: str = "full"

    def units(self) -> list[Unit]:
        if self.type == "classify":
            return [Unit("", self.labels)]
        if self.type == "choice":
            # The listing goes after the prompt; as a suffix it works for every prompt form.
            listing = "\n" + "".join(f"{i}. {c}\n" for i, c in zip(self.ids, self.choices)) + "Answer:"
            return [Unit(listing, [f" {i}" for i in self.ids])]
        return [Unit(multi_suffix(c), list(MULTI_LABELS)) for c in self.choices]


def parse_tasks(body: Any) -> tuple[list[Task], str | None, bool]:
    """``(tasks, model, batch)`` from a ``/v1/classify`` body; raises TaskError."""
    if not isinstance(body, dict):
        raise TaskError("the request body must be a JSON object")
    if "inputs" in body:
        unknown = sorted(set(body) - BATCH_FIELDS)
        if unknown:
            raise TaskError(f"unknown top-level field {unknown[0]!r} next to inputs (allowed: model, inputs); "
                            "task fields go inside each input", unknown[0])
        inputs = body["inputs"]
        if not isinstance(inputs, list) or not inputs:
            raise TaskError("inputs must be a non-empty list of task objects", "inputs")
        if len(inputs) > MAX_INPUTS:
            raise TaskError(f"inputs has {len(inputs)} tasks; at most {MAX_INPUTS} per call", "inputs")
        tasks = [_parse_task(t, n, f"inputs[{n}]") for n, t in enumerate(inputs)]
        batch = True
    else:
        tasks = [_parse_task({k: v for k, v in body.items() if k != "model"}, 0, None)]
        batch = False
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise TaskError("model must be a string", "model")
    return tasks, model, batch


def _param(where: str | None, name: str) -> str:
    return f"{where}.{name}" if where else name


def _strings(value: Any, param: str, *, lo: int, hi: int, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{param} must be a list of strings", param)
    if not lo <= len(value) <= hi:
        raise TaskError(f"{param} must list {lo} to {hi} {what} (got {len(value)})", param)
    if any(not v.strip() for v in value):
        raise TaskError(f"{param} must not contain blank {what}", param)
    if len(set(value)) != len(value):
        raise TaskError(f"{param} has duplicate {what}", param)
    return value


def _parse_task(raw: Any, index: int, where: str | None) -> Task:
    if not isinstance(raw, dict):
        raise TaskError(f"{where or 'the body'} must be a task object", where)
    unknown = sorted(set(raw) - TASK_FIELDS)
    if unknown:
        raise TaskError(f"unknown field {unknown[0]!r} (allowed: {', '.join(sorted(TASK_FIELDS))})",
                        _param(where, unknown[0]))
    kind = raw.get("type", "classify")
    if kind not in TASK_TYPES:
        raise TaskError(f"type must be one of {', '.join(TASK_TYPES)} (got {kind!r})", _param(where, "type"))
    tid = raw.get("id")
    if tid is not None and not isinstance(tid, (str, int, float, bool)):
        raise TaskError("id must be a string or number", _param(where, "id"))
    task = Task(index=index, id=tid, type=kind)
    given = [k for k in ("prompt", "input_ids", "messages") if raw.get(k) is not None]
    if len(given) != 1:
        raise TaskError("give exactly one of prompt, input_ids, messages", _param(where, "prompt"))
    if "prompt" in given:
        if not isinstance(raw["prompt"], str) or not raw["prompt"]:
            raise TaskError("prompt must be a non-empty string", _param(where, "prompt"))
        task.prompt = raw["prompt"]
    elif "input_ids" in given:
        ids = raw["input_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           and i >= 0 for i in ids):
            raise TaskError("input_ids must be a non-empty list of token ids", _param(where, "input_ids"))
        task.input_ids = ids
    else:
        msgs = raw["messages"]
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs):
            raise TaskError("messages must be a non-empty list of {role, content} objects with string content",
                            _param(where, "messages"))
        task.messages = msgs
    scoring = raw.get("label_scoring", "full")
    if scoring not in SCORINGS:
        raise TaskError(f"label_scoring must be one of {', '.join(SCORINGS)}", _param(where, "label_scoring"))
    task.scoring = scoring
    expected = {"classify": {"labels"}, "choice": {"choices", "ids"}, "multi": {"choices", "threshold"}}[kind]
    stray = sorted(k for k in ("labels", "choices", "ids", "threshold") if k in raw and k not in expected)
    if stray:
        raise TaskError(f"{stray[0]} is not used by type {kind!r}", _param(where, stray[0]))
    if kind == "classify":
        task.labels = _strings(raw.get("labels"), _param(where, "labels"), lo=2, hi=MAX_LABELS, what="labels")
    elif kind == "choice":
        task.choices = _strings(raw.get("choices"), _param(where, "choices"), lo=2, hi=len(CHOICE_IDS),
                                what="choices")
        ids = raw.get("ids")
        if ids is None:
            task.ids = list(CHOICE_IDS[:len(task.choices)])
        else:
            task.ids = _strings(ids, _param(where, "ids"), lo=len(task.choices), hi=len(task.choices),
                                what="ids (one per choice)")
            if any(any(ch.isspace() for ch in i) for i in task.ids):
                raise TaskError("ids must not contain whitespace", _param(where, "ids"))
    else:
        task.choices = _strings(raw.get("choices"), _param(where, "choices"), lo=1, hi=MAX_MULTI_CHOICES,
                                what="choices")
        thr = raw.get("threshold", 0.5)
        if isinstance(thr, bool) or not isinstance(thr, (int, float)) or not 0.0 <= thr <= 1.0:
            raise TaskError("threshold must be a number in [0, 1]", _param(where, "threshold"))
        task.threshold = float(thr)
    return task


def expand_text(task: dict) -> list[UnitText]:
    """A text task (``prompt``) as the atomic prefills the router makes of it, in text form."""
    (parsed,), _, _ = parse_tasks(task)
    if parsed.prompt is None:
        raise TaskError("expand_text needs a text prompt", "prompt")
    return [UnitText(parsed.prompt + u.suffix, u.labels) for u in parsed.units()]


# ---------------------------------------------------------------------------------------------
# One unit as a /v1/score call, and back


@dataclass
class ScorePlan:
    """The ``/v1/score`` body of one unit and how to read its answer back."""

    body: dict
    label_ids: list[list[int]]
    single_token: bool
    prefixes: list[tuple[int, ...]] = field(default_factory=list)
    """The label prefix (token ids) each item of ``body`` stands for, in order."""


def plan_score(query: list[int] | str, label_ids: list[list[int]], scoring: str,
               decode: Callable[[list[int]], str] | None = None) -> ScorePlan:
    """Items are the distinct proper prefixes of the labels; each item scores the tokens that follow it.

    ``query`` is the unit's token ids, or its text when the router's tokenizer is not exact (the worker then
    tokenizes the prompt itself): the items are then text too, each prefix written back with ``decode``, and
    SGLang scores ``query + item`` tokenized whole (a label's later tokens may merge across that boundary;
    single-token labels and ``first_token`` scoring use only the empty item and are exact)."""
    if scoring == "first_token":
        label_ids = [ids[:1] for ids in label_ids]
    single = all(len(ids) == 1 for ids in label_ids)
    prefixes: dict[tuple[int, ...], list[int]] = {}
    for ids in label_ids:
        for k in range(len(ids)):
            nxt = prefixes.setdefault(tuple(ids[:k]), [])
            if ids[k] not in nxt:
                nxt.append(ids[k])
    keys = list(prefixes)
    if isinstance(query, str):
        if decode is None and any(keys):
            raise ValueError("a text query with multi-token labels needs decode")
        items: list = [decode(list(p)) if p else "" for p in keys]  # type: ignore[misc]
    else:
        items = [list(p) for p in keys]
    body = {"query": query, "items": items, "label_token_ids": [prefixes[p] for p in prefixes],
            "apply_softmax": single, "return_token_logprobs": True}
    return ScorePlan(body, label_ids, single, keys)


def read_score(plan: ScorePlan, response: dict) -> tuple[list[float], list[float]]:
    """``(probs, logprobs)`` per label from a ``/v1/score`` response; raises ValueError if malformed."""
    scores, token_lps = response.get("scores"), response.get("token_logprobs")
    items = plan.body["items"]
    if not isinstance(token_lps, list) or len(token_lps) != len(items) or not isinstance(scores, list):
        raise ValueError("the worker's /v1/score answer lacks token_logprobs for every item")
    keys = plan.prefixes or [tuple(item) for item in items]
    table = {key: dict(zip(labels, lps)) for key, labels, lps in zip(keys, plan.body["label_token_ids"], token_lps)}
    logprobs = []
    for ids in plan.label_ids:
        lp = 0.0
        for k, t in enumerate(ids):
            v = table[tuple(ids[:k])][t]
            lp += v if v is not None else -math.inf
        logprobs.append(lp)
    if plan.single_token:
        probs = [float(p) for p in scores[0]]  # SGLang's own softmax over the label tokens
    else:
        top = max(logprobs)
        if top == -math.inf:
            probs = [1.0 / len(logprobs)] * len(logprobs)
        else:
            w = [math.exp(lp - top) for lp in logprobs]
            s = sum(w)
            probs = [x / s for x in w]
    return probs, logprobs


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def combine(task: Task, answers: list[tuple[list[float], list[float]]]) -> dict:
    """The task's result object from its units' ``(probs, logprobs)``, in unit order."""
    out: dict[str, Any] = {"id": task.id, "type": task.type}
    if task.type == "classify":
        probs, lps = answers[0]
        i = _argmax(probs)
        out.update(labels=task.labels, probs=probs, logprobs=lps, index=i, label=task.labels[i])
    elif task.type == "choice":
        probs, lps = answers[0]
        i = _argmax(probs)
        out.update(choices=task.choices, ids=task.ids, probs=probs, logprobs=lps, index=i, answer=task.ids[i])
    else:
        p_yes = [probs[0] for probs, _ in answers]
        lp_yes = [lps[0] for _, lps in answers]
        out.update(choices=task.choices, probs=p_yes, logprobs=lp_yes, index=_argmax(p_yes),
                   selected=[i for i, p in enumerate(p_yes) if p >= task.threshold], threshold=task.threshold)
    out["scoring"] = task.scoring
    return out
