"""The simulator's chat template: ChatML, rendered in Jinja2's sandbox like a real engine's.

Chat requests are rendered to one prompt string before they reach the prefix cache, so two chats
with the same system prompt share the blocks of that system prompt, as on vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pipeline.errors import BadInputError

#: ChatML, the shape of Qwen's and many other models' tokenizer_config.json chat_template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@lru_cache(maxsize=1)
def _template() -> Template:
    return ImmutableSandboxedEnvironment(keep_trailing_newline=True).from_string(CHAT_TEMPLATE)


def _content_text(content: Any, index: int) -> str:
    """Text of a message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, Mapping)]
        return "".join(str(text) for text in texts)
    raise BadInputError("content must be a string or a list of parts", where=f"messages[{index}]")


def normalise_messages(messages: Any) -> list[dict[str, str]]:
    """Validate OpenAI chat messages and flatten their content to text."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise BadInputError("must be a non-empty list of messages", where="messages")
    out: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            raise BadInputError("each message needs a known role", where=f"messages[{index}]")
        out.append(
            {"role": str(message["role"]), "content": _content_text(message.get("content"), index)}
        )
    return out


def render_chat(messages: Any, *, add_generation_prompt: bool = True) -> str:
    """Render ``messages`` through the chat template into the prompt the engine sees."""
    normalised = normalise_messages(messages)
    return _template().render(messages=normalised, add_generation_prompt=add_generation_prompt)
