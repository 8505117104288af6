"""The values vLLM's request lines print (FORMATS.md 1.5-1.7): a ``Received request`` line's
prompt, sampling parameters, token ids and adapter; a ``Request <id> details`` line's prompt
and ids; a ``Generated response`` line's output ids and finish reason. Each reader raises
``ValueError`` (or returns ``None``) for a line that is not whole: a cut line ends inside a
value."""

from __future__ import annotations

import re
from typing import Any

from pipeline.ingest.reprs import python_str_at
from pipeline.ingest.vllm.fields import sampling_fields
from pipeline.prefix_blocks import count_tokens

PARAMS = re.compile(r"(?:sampling[ _]params|params): (?P<kind>\w+)\(")
LORA_NAME = re.compile(r"lora_name='((?:[^'\\]|\\.)*)'")
#: key markers that end a ``Received request`` line, searched from the right
TAIL_KEYS = (
    ", prompt_adapter_request: ",
    ", lora_request: ",
    ", prompt_embeds shape: ",
    ", prompt_token_ids: ",
    ", prompt token ids: ",
)
#: finish reasons of a request that ended well (``abort`` ends it, but not well)
FINISHED_OK = ("stop", "length", "tool_calls", "streaming_complete")
#: finish reasons vLLM prints (FinishReason, OpenAI's tool_calls, the streaming markers); a
#: line ending in anything else was cut
FINISH_REASONS = frozenset(
    ("stop", "length", "abort", "error", "repetition", "tool_calls", "None", "streaming_complete")
)
#: texts read once are cached, at most this many (repeated parameters, envelopes)
CACHE_SIZE = 4096
#: the longest text after a prompt that is cached (a longer one holds token ids: unique)
_CACHED_REST_CHARS = 2048
#: a ``Received request`` line that prints no prompt (a printed one is a string, or None)
NO_PROMPT = object()
#: what follows a request line's prompt, read: its record fields and its printed token ids
Rest = tuple[dict[str, Any], str | None]
#: what may follow a prompt's token-id list for it to be the list the tail keys find (they
#: are found from the right: a key inside a later value would move it)
_AFTER_IDS = frozenset(
    f"{embeds}{lora}{adapter}"
    for embeds in ("", ", prompt_embeds shape: None")
    for lora in ("", ", lora_request: None")
    for adapter in ("", ", prompt_adapter_request: None")
)
_IDS_KEY = ", prompt_token_ids: ["
#: the tail keys found before the token ids (:meth:`ReceivedReader._after_prompt`): one printed
#: before the ids but not after them would take them into its value
_KEYS_BEFORE_IDS = TAIL_KEYS[: TAIL_KEYS.index(", prompt_token_ids: ")]


def whole_value(value: str) -> bool:
    """``None``, or a printed list / call whose brackets close (``[1, 2]``, ``X(a=[1])``)."""
    if value == "None":
        return True
    if not value.endswith(("]", ")")):
        return False
    if value[0] == "[" and value.find("[", 1) < 0 and "(" not in value and ")" not in value:
        return value.find("]") == len(value) - 1  # a flat list (``find`` beats ``count`` 10x)
    return value.count("[") == value.count("]") and value.count("(") == value.count(")")


def without_token_ids(rest: str) -> tuple[str, int | None]:
    """What follows a prompt with its flat token-id list printed as ``[]`` (requests that
    differ only by their ids then share one read), and the list's count; ``rest`` and None
    when it holds no such list as its last part (read whole then). Both read alike: the list
    is whole either way, holds no key the tail keys could find instead, and no key found
    before it (:data:`_KEYS_BEFORE_IDS`) is printed before it and not after it."""
    at = rest.rfind(_IDS_KEY)
    close = rest.find("]", at) if at >= 0 else -1
    if close < 0 or (after := rest[close + 1 :]) not in _AFTER_IDS:
        return rest, None
    if any(key not in after and rest.find(key, 0, close) >= 0 for key in _KEYS_BEFORE_IDS):
        return rest, None  # (``lora_request: X, prompt_token_ids: [..]``: X's value holds them)
    body = rest[at + len(_IDS_KEY) : close]
    if "[" in body or "(" in body or ")" in body or ":" in body:  # (nested, or a key inside)
        return rest, None
    return f"{rest[:at]}, prompt_token_ids: []{after}", listed_count(body)


def listed_count(body: str) -> int:
    """How many values a printed list's inside holds (``1, 2, 3``: 3; blank: 0), by its commas."""
    return body.count(",") + 1 if body.strip() else 0


def as_token_ids(body: str) -> list[int] | None:
    """The token ids of a printed list's inside (``1, 2, 3``); None when one is no integer."""
    try:
        return [int(x) for x in body.split(",")]
    except ValueError:
        return None


def cut_looking(prompt: str, ids: int) -> bool:
    """Whether a prompt of ``ids`` characters printed with ``ids`` token ids looks cut by
    ``--max-log-len`` (both cut to the same N): its text holds far fewer tokens than that.

    A whole prompt has about one token per pseudo-token (at most one per non-ASCII character
    more, for scripts a tokenizer splits finely), plus a few special tokens; a cut one has one
    token per *character*. Asking for twice the generous estimate plus four keeps short whole
    prompts (``'Hi'``: two ids with BOS) from passing for cut ones.
    """
    if ids == 0:
        return False
    estimate = count_tokens(prompt) + sum(1 for char in prompt if ord(char) > 127)
    return ids >= 2 * estimate + 4


def details_values(rest: str) -> tuple[str | None, str]:
    """The prompt and the printed token ids of a ``Request <id> details: prompt: `` line's
    ``rest``; raises ``ValueError`` unless both are whole."""
    found = python_str_at(rest, 0)
    if found is None:
        raise ValueError("prompt is not a string literal")
    ids_at = rest.rfind(", prompt_token_ids: ")
    embeds_at = rest.rfind(", prompt_embeds shape: ")
    ids = None
    if ids_at >= 0:
        stop = embeds_at if embeds_at > ids_at else len(rest) - 1
        ids = rest[ids_at + 20 : stop]
    if ids is None or not whole_value(ids) or found[1] > ids_at:
        raise ValueError("no whole prompt_token_ids part")
    return found[0], ids


def generated_values(msg: str, colon: int) -> tuple[str, str, str | None, str] | None:
    """Request id, mode (``(streaming delta)`` or none), printed output ids and finish reason
    of a ``Generated response <id>[ mode]: output: ...`` line whose ``: output: `` is at
    ``colon``; None when the line is not whole."""
    reason_at = msg.rfind(", finish_reason: ")
    ids_at = msg.rfind(", output_token_ids: ", 0, reason_at if reason_at >= 0 else None)
    reason = msg[reason_at + 17 :] if reason_at >= 0 else None
    ids = msg[ids_at + 20 : reason_at] if ids_at >= 0 and reason_at >= 0 else None
    if reason not in FINISH_REASONS or (ids is not None and not whole_value(ids)):
        return None
    request_id, _, mode = msg[19:colon].partition(" ")
    return request_id, mode, ids, reason


class ReceivedReader:
    """Reads ``Received request`` lines; what follows a prompt (parameters, token ids,
    adapter) is read once per distinct text (clients repeat theirs)."""

    def __init__(self) -> None:
        # requests of one client share their sampling parameters: parse each text once
        self._params_cache: dict[str, dict[str, Any]] = {}
        #: what follows a request line's prompt, read, by its text
        self._rest_cache: dict[str, Rest] = {}

    def read(self, msg: str, start: int, end: int) -> tuple[Any, Rest, int | None]:
        """The prompt of ``msg[start:end]`` (:data:`NO_PROMPT` when it prints none), what
        follows it read (:data:`Rest`), and the count of its token ids when they were only
        counted; raises ``ValueError`` unless the line is whole (a cut line ends inside a
        value). The prompt comes first and is read first; a completion's token ids, unique,
        are counted and left out of the cached text when its prompt is read."""
        prompt: Any = NO_PROMPT
        if msg.startswith("prompt: ", start, end):
            found = python_str_at(msg, start + 8, end)
            if found is None:
                raise ValueError("prompt is not a string literal")
            prompt, start = found
        rest = msg[start:end]
        read = self._rest_cache.get(rest)
        id_count = None
        if read is None and isinstance(prompt, str):  # (its ids give no hashes then)
            rest, id_count = without_token_ids(rest)
            read = self._rest_cache.get(rest)
        if read is None:
            read = self._after_prompt(rest)
            if len(rest) <= _CACHED_REST_CHARS:
                if len(self._rest_cache) >= CACHE_SIZE:
                    self._rest_cache.clear()
                self._rest_cache[rest] = read
        return prompt, read, id_count

    def _after_prompt(self, rest: str) -> Rest:
        """The fields of what follows a ``Received request`` line's prompt (or its id, when it
        has none), and its printed token ids: the tail keys are found from the right (a value
        never holds them)."""
        fields: dict[str, Any] = {}
        start, end = 0, len(rest)
        tail: dict[str, str] = {}
        for key in TAIL_KEYS:
            cut = rest.rfind(key, start, end)
            if cut >= 0:
                tail[key[2:-2]] = rest[cut + len(key) : end]
                end = cut
        if not tail or not all(map(whole_value, tail.values())):
            raise ValueError("no whole lora_request / prompt_token_ids part")
        params = PARAMS.search(rest, start, end)
        if params is None:
            raise ValueError("no params")
        close = rest.rfind(")", start, end)
        if close < 0:
            raise ValueError("params are not closed")
        if params.group("kind") == "SamplingParams":
            fields.update(self._sampling(rest[params.end() : close]))
        lora = tail.get("lora_request")
        if lora and lora != "None":
            name = LORA_NAME.search(lora)
            fields["adapter"] = name.group(1) if name else lora
        return fields, tail.get("prompt_token_ids") or tail.get("prompt token ids")

    def _sampling(self, body: str) -> dict[str, Any]:
        """The record fields of a ``SamplingParams(...)``'s inside, read once per text."""
        fields = self._params_cache.get(body)
        if fields is None:
            if len(self._params_cache) >= CACHE_SIZE:
                self._params_cache.clear()
            fields = self._params_cache[body] = sampling_fields(body)
        return fields
