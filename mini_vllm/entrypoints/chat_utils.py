"""A chat message's content as the one string a chat template renders, and a template given
on the command line (upstream's ``vllm/entrypoints/chat_utils.py``, text parts only), shared by
``LLM.chat`` and the server so that one conversation becomes the same prompt offline and
online."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_chat_template(chat_template: str | None) -> str | None:
    """``--chat-template``: a file's contents, or the string itself when it holds a Jinja
    character (``{``, ``}`` or a newline), as upstream's ``load_chat_template``; a string that
    looks like a path but cannot be read is refused (upstream also looks among its built-in
    templates, which mini-vLLM does not ship)."""
    if chat_template is None:
        return None
    try:
        return Path(chat_template).read_text()
    except OSError as exc:
        if any(c in chat_template for c in "{}\n"):
            return chat_template
        raise ValueError(
            f"The supplied chat template ({chat_template}) looks like a file path, but it "
            f"failed to be opened. Reason: {exc}"
        ) from None


def text_content(content: Any) -> str:
    """``content`` as a string: OpenAI's list of parts (``[{"type": "text", "text": ...}]``)
    joined with newlines, as upstream's ``_parse_chat_message_content_parts`` joins them for a
    template that takes strings (given the list, such a template prints its Python repr).

    Raises:
        ValueError: for a part that is not text (images, audio: mini-vLLM serves text only).
    """
    if not isinstance(content, list):
        return "" if content is None else content
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"content part of type {kind!r} is not supported (text only)")
        texts.append(str(part.get("text", "")))
    return "\n".join(texts)
