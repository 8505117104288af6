"""A history-then-future workload of requests that share long template prefixes.

Sixteen prompt templates (system prompts / document heads of 600-1500 tokens, lengths drawn
uniformly) are each followed by a short, always different user part (15-40 words). Template
popularity is Zipf-like (weight of rank r is 1/r, ranks assigned to templates at random) and stable
over time: the history and the future are independent draws from the same popularity, so past
frequency predicts the future only as well as a stable Zipf mix allows; the order in which
templates first appear in the future is whatever the draw gives. Half the templates are served as
chat requests (the template is the system message), half as completions (template + user part).
Nothing here knows what any warm-up strategy will do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

# Plain business vocabulary: template text that tokenizes like prose, not like code.
_VOCABULARY = """
account address agent answer archive audit balance batch budget cache call case change
check claim client code column commit contract cost customer data date deadline
delivery detail device document draft email engine entry error event field file filter
format function goal group history invoice issue item job key label language layer
ledger limit line list log market message method metric model module network note
number offer order owner package page parameter partner payment period plan policy
price priority process product profile project query queue quota rate record region
release report request resource result review risk role rule schedule schema score
section service session setting shipment signal source stage standard state status step
storage summary supplier system table task team template tenant term test text ticket
time token topic total trace transaction update user value vendor version warehouse
window workflow always carefully clearly briefly never only politely precisely strictly
usually must should may will can explain list describe verify summarise compare refuse
escalate cite quote include exclude the a an of to in for with on by from as and or but
if when unless after before
"""
_WORDS = tuple(_VOCABULARY.split())


@dataclass(frozen=True)
class Template:
    """A shared prompt head: the system message (chat) or the head of the prompt (completion)."""

    index: int
    text: str
    endpoint: str  # "chat" | "completion"
    weight: float


@dataclass(frozen=True)
class Request:
    """One request of the workload; ``template`` indexes :attr:`Workload.templates`."""

    template: int
    endpoint: str
    user: str

    def body(self, templates: list[Template], model: str, max_tokens: int) -> dict:
        """The OpenAI-compatible JSON body of this request."""
        head = templates[self.template].text
        body: dict = {"model": model, "max_tokens": max_tokens, "temperature": 0.0}
        if self.endpoint == "chat":
            body["messages"] = [
                {"role": "system", "content": head},
                {"role": "user", "content": self.user},
            ]
        else:
            body["prompt"] = f"{head}\n\nQuestion: {self.user}\nAnswer:"
        return body


@dataclass
class Workload:
    """Templates, the history that was served before the restart and the future after it."""

    templates: list[Template]
    history: list[Request]
    future: list[Request] = field(default_factory=list)

    def first_uses(self) -> list[int]:
        """Positions in :attr:`future` of each template's first request, in future order."""
        seen: set[int] = set()
        positions = []
        for position, request in enumerate(self.future):
            if request.template not in seen:
                seen.add(request.template)
                positions.append(position)
        return positions


def _sentence(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=rng.randint(8, 18))
    return " ".join(words).capitalize() + "."


def template_text(
    index: int, target_tokens: int, rng: random.Random, count: Callable[[str], int]
) -> str:
    """Prose of about ``target_tokens`` tokens (``count`` measures), unique from its first word."""
    text = f"Template {index}: you are the assistant of desk {index * 7919 % 1000}."
    while count(text) < target_tokens:
        text += " " + _sentence(rng)
    return text


def _user_part(rng: random.Random) -> str:
    return " ".join(rng.choices(_WORDS, k=rng.randint(15, 40))) + "?"


def build_workload(
    count: Callable[[str], int],
    n_templates: int = 16,
    n_history: int = 128,
    n_future: int = 48,
    min_tokens: int = 600,
    max_tokens: int = 1500,
    zipf_s: float = 1.0,
    seed: int = 0,
) -> Workload:
    """The workload described in the module docstring; ``count`` measures tokens of a text."""
    rng = random.Random(seed)
    ranks = list(range(1, n_templates + 1))
    rng.shuffle(ranks)
    templates = [
        Template(
            index=i,
            text=template_text(i, rng.randint(min_tokens, max_tokens), rng, count),
            endpoint="chat" if i % 2 == 0 else "completion",
            weight=1.0 / ranks[i] ** zipf_s,
        )
        for i in range(n_templates)
    ]
    weights = [t.weight for t in templates]

    def draw(n: int) -> list[Request]:
        picks = rng.choices(range(n_templates), weights=weights, k=n)
        return [Request(i, templates[i].endpoint, _user_part(rng)) for i in picks]

    history = draw(n_history)
    return Workload(templates, history, draw(n_future))
