"""The prompts SGLang builds for ``/v1/decisions`` (``serving_decisions.py: render_text, render_question``).

Prompt format version 1: each question becomes one user message (the input, a blank line, then the
question and its options), rendered with the chat template with the generation prompt added and
reasoning toggled off, then encoded without special tokens.
"""

from __future__ import annotations

import json
from typing import Any

from sgl_moe.router.errors import RequestError
from sgl_moe.router.request.router_tokenizer import ChatTemplateError, NoChatTemplate, RouterTokenizer

REASONING_TOGGLES = ("thinking", "enable_thinking")
"""Chat template kwargs SGLang may set to turn reasoning off (``serving_decisions._PARSER_TOGGLE_MODES``)."""


def is_blank(value: Any) -> bool:
    """Empty, whitespace or None, as SGLang's decision validators judge it."""
    return not (value.strip() if isinstance(value, str) else value)


def render_text(value: Any) -> str:
    """A decision field as prompt text: strings as they are, anything else as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def decision_question(text: str, question: Any, param: str) -> str:
    """The user message SGLang renders for one decision question."""
    if not isinstance(question, dict) or question.get("type") not in ("choice", "score", "yes_no"):
        raise RequestError(400, f"{param} must be an object with type choice, score or yes_no", param)
    kind = question["type"]
    if is_blank(question.get("question")):
        raise RequestError(400, f"{param}.question must not be blank", param)
    question_text = render_text(question["question"])
    if kind == "choice":
        options = question.get("options")
        if not isinstance(options, list) or not 2 <= len(options) <= 26 or not all(
                isinstance(o, dict) and isinstance(o.get("name"), str) for o in options):
            raise RequestError(400, f"{param}.options must list 2 to 26 options with names", param)
        lines = [f"Question: {question_text}"]
        for label, option in zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", options):
            detail = render_text(option.get("description"))
            lines.append(f"{label}: {option['name']} - {detail}" if detail else f"{label}: {option['name']}")
        lines.append("Answer with the letter of one option only.")
    elif kind == "score":
        levels = question.get("levels")
        if not isinstance(levels, list) or not 2 <= len(levels) <= 10:
            raise RequestError(400, f"{param}.levels must list 2 to 10 levels", param)
        lines = [f"Question: {question_text}"]
        lines += [f"{label}: {render_text(level)}" for label, level in enumerate(levels)]
        lines.append("Answer with the number of one level only.")
    else:
        lines = [f"Is the following true? {question_text}"]
        for label in ("yes", "no"):
            detail = render_text(question.get(label))
            if detail:
                lines.append(f"{label}: {detail}")
        lines.append("Answer with yes or no only.")
    return "\n".join([text, "", *lines])


def decision_prompts(tok: RouterTokenizer, input_value: Any, questions: list[Any],
                     kwargs: dict[str, Any]) -> tuple[list[list[int]], bool]:
    """The prompt ids of every question and whether they are exact (else a best estimate).

    Not exact when the template reads a reasoning toggle (whether SGLang sets it depends on the
    worker's reasoning parser) or when there is no template to render (the estimate is then the bare
    question).
    """
    text = render_text(input_value)
    template = tok.chat_template or ""
    toggles = {name: False for name in REASONING_TOGGLES if name in template}
    exact = tok.exact and tok.has_chat_template and not toggles
    prompts = []
    for n, question in enumerate(questions):
        content = decision_question(text, question, f"questions[{n}]")
        try:
            rendered = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                               **{**toggles, **kwargs})
        except (NoChatTemplate, ChatTemplateError):
            rendered, exact = content, False  # the worker answers; the estimate is the bare question
        prompts.append(tok.encode_plain(rendered))
    return prompts, exact
