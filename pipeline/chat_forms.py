"""A chat prompt as an engine rendered it, read back into the messages its users sent.

An engine's request log holds a chat as its chat template rendered it (one text). A router
whose memory is keyed on a request's *text* (sglang-router's ``cache_aware``) keys a chat on
its messages, so a prime of that rendered text sent to ``/v1/completions`` is placed apart from
the chat's users. Read back into messages — the last one open where the prefix ends inside it —
and sent as a chat, the prime is keyed as its users are, and the engine renders it to the same
head (all but the closing tokens of the open message).

Two template families are read: ChatML (``<|im_start|>role\\ncontent<|im_end|>``: Qwen, many
others, and the engine simulator) and Llama 3's headers (``<|start_header_id|>role
<|end_header_id|>\\n\\ncontent<|eot_id|>``). Any other text is not a rendered chat (None).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Messages = tuple[dict[str, str], ...]


@dataclass(frozen=True)
class ChatForm:
    """One chat template family: how a message opens and closes, and what may come first."""

    name: str
    opening: re.Pattern[str]
    closing: str
    preamble: str = ""


FORMS = (
    ChatForm("chatml", re.compile(r"<\|im_start\|>([a-z_]+)\n"), "<|im_end|>"),
    ChatForm(
        "llama3",
        re.compile(r"<\|start_header_id\|>([a-z_]+)<\|end_header_id\|>\n\n"),
        "<|eot_id|>",
        preamble="<|begin_of_text|>",
    ),
)


def chat_messages(text: str) -> Messages | None:
    """The messages ``text`` renders, in the first family it is written in; None when it is not
    a rendered chat. An empty open message at the end (the generation prompt) is left out."""
    for form in FORMS:
        messages = _read(form, text)
        if messages:
            return messages
    return None


def _opening_cut(form: ChatForm, rest: str) -> bool:
    """Whether ``rest`` is the start of an opening header cut short (no newline yet)."""
    literal = form.opening.pattern.split("(")[0].replace("\\", "")
    return "\n" not in rest and (rest.startswith(literal) or literal.startswith(rest))


def _without_cut_closing(form: ChatForm, content: str) -> str:
    """An open message's content without the start of its closing marker where the prefix
    ends inside it."""
    for size in range(len(form.closing) - 1, 0, -1):
        if content.endswith(form.closing[:size]):
            return content[:-size]
    return content


def _read(form: ChatForm, text: str) -> Messages | None:
    rest = text.removeprefix(form.preamble)
    messages: list[dict[str, str]] = []
    while rest:
        opened = form.opening.match(rest)
        if opened is None and messages and _opening_cut(form, rest):
            break  # the prefix ends inside the next message's header
        if opened is None:
            return None  # text between messages: not this family's rendering
        body = rest[opened.end() :]
        end = body.find(form.closing)
        content = _without_cut_closing(form, body) if end < 0 else body[:end]
        messages.append({"role": opened.group(1), "content": content})
        if end < 0:
            break
        rest = body[end + len(form.closing) :].lstrip("\n")
    if messages and not messages[-1]["content"] and not text.endswith(form.closing):
        messages.pop()  # the generation prompt's open header
    return tuple(messages) if messages else None
