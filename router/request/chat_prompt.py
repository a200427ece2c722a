"""The token ids SGLang prefills for a chat conversation (``serving_chat.py: _apply_jinja_template``).

SGLang renders the tokenizer's chat template to text and encodes it with
``add_special_tokens=False``. Used for ``/v1/chat/completions`` and for the chat-form tasks of
``/v1/classify``.
"""

from __future__ import annotations

from typing import Any

from sgl_moe.router.request.router_tokenizer import ChatTemplateError, NoChatTemplate, RouterTokenizer

GENERIC_MESSAGE_FIELDS = ("role", "content", "tool_call_id", "name", "phase", "reasoning_content", "tool_calls",
                          "tools", "prefix")
"""``ChatCompletionMessageGenericParam`` fields; a user message (``...UserParam``) has role and content only."""


def chat_prompt(tok: RouterTokenizer, messages: list[dict], body: dict,
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
    rendered = [template_message(m) for m in messages]
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


def template_message(message: dict) -> dict:
    """A message as SGLang hands it to the template: its model's non-None fields, content as text."""
    role = message["role"].lower()
    fields = ("role", "content") if role == "user" else GENERIC_MESSAGE_FIELDS
    rendered = {k: message[k] for k in fields if message.get(k) is not None}
    rendered["role"] = role
    rendered["content"] = flatten_content(message.get("content"))
    return rendered


def flatten_content(content: Any) -> str:
    """Message content as text: text parts joined by spaces, as SGLang's string content format does."""
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                        and p.get("type") in ("text", "input_text"))
    return content if isinstance(content, str) else ""
