"""A workload request, its contract-A task object and its prefill units as segments.

The router (contract A, ``router/front/prefill_tasks.py``) renders a task into the atomic prefills it sends:

* classify: the prompt;
* choice:   ``prompt + "\\n" + "".join(f"{id}. {choice}\\n") + "Answer:"``;
* multi:    one sibling per choice, ``prompt + f"\\nCandidate: {choice}\\nDoes the candidate apply? Answer:"``.

``unit_segments`` writes the same text as segments. Because every segment starts with a space or a
newline (see ``segments``), the fixed pieces are cut so that each starts with ``"\\n"`` and a choice's
segment carries the space that the template puts before it: ``"\\nA."`` + ``" w1 w2"`` + ... +
``"\\nAnswer:"``. The task therefore sends each choice as its segment text without the leading space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sgl_moe.workloads.segments import Segment, literal, segment_text

TaskKind = Literal["classify", "choice", "multi"]

CHOICE_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
"""Contract A's default choice identifiers."""

ANSWER = "\nAnswer:"
"""Ends a choice listing (and the workloads' own classify prompts)."""

CANDIDATE = "\nCandidate:"
"""Precedes a multi sibling's candidate (whose segment brings the space)."""

CANDIDATE_QUESTION = "\nDoes the candidate apply? Answer:"
"""Ends a multi sibling."""


@dataclass(slots=True)
class WorkloadRequest:
    """One prefill-only request of a workload, as segments (text is rendered only by ``to_task``)."""

    id: str
    """E.g. ``"quality-000123"``: the workload and the request's rank among that workload's requests."""
    workload: str
    """One of ``WORKLOADS``."""
    kind: TaskKind
    """Contract A task type."""
    context: list[Segment]
    """The prompt in order: shared instruction, document, question, ..."""
    labels: list[str]
    """classify: label strings such as ``[" yes", " no"]``; otherwise empty."""
    choices: list[Segment]
    """choice / multi candidates; otherwise empty."""
    group: str
    """Prefix group: requests whose prompts share a leading part of at least one KV page have the same
    group (the key of that shared leading segment); a request sharing less has a group of its own."""


def prompt_tokens(req: WorkloadRequest) -> int:
    """Prompt length in tokens (without the choice listing or candidate suffix)."""
    return sum(s.tokens for s in req.context)


def prompt_text(req: WorkloadRequest) -> str:
    return "".join([segment_text(s) for s in req.context])


def choice_text(seg: Segment) -> str:
    """A candidate as the task lists it: its segment text without the leading space the template adds."""
    return segment_text(seg)[1:]


def to_task(req: WorkloadRequest) -> dict[str, Any]:
    """The contract-A task object of ``req``."""
    task: dict[str, Any] = {"id": req.id, "type": req.kind, "prompt": prompt_text(req)}
    if req.kind == "classify":
        task["labels"] = list(req.labels)
    else:
        task["choices"] = [choice_text(c) for c in req.choices]
    return task


def unit_segments(req: WorkloadRequest) -> list[list[Segment]]:
    """Each prefill unit the router makes of ``req``, as segments (see the module docstring)."""
    if req.kind == "classify":
        return [list(req.context)]
    if req.kind == "choice":
        unit = list(req.context)
        for ident, choice in zip(CHOICE_IDS, req.choices):
            unit.append(literal(f"\n{ident}."))
            unit.append(choice)
        unit.append(literal(ANSWER))
        return [unit]
    candidate, question = literal(CANDIDATE), literal(CANDIDATE_QUESTION)
    return [[*req.context, candidate, choice, question] for choice in req.choices]
