"""A fleet whose users change topic: code questions, then legal ones (a generated workload).

Each topic has its own assistants (a long system prompt each, the prefix a warm-up primes,
popularity falling as 1/rank) and its own questions (built from the topic's words, so no two
requests ask quite the same). A window sends ``requests`` requests; the share of the new topic
is 0 before ``change``, ``ramp`` in the window ``change`` (users move within the hour, not in
one instant) and ``after`` from the next one. ``change=None`` is a workload whose topic holds.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

TOPICS = {
    "code": {
        "teams": (
            "payments",
            "search",
            "billing API",
            "mobile app",
            "data platform",
            "auth",
            "frontend",
            "CI pipeline",
        ),
        "role": "a senior software engineer who reviews code and answers programming questions",
        "rules": "Prefer small, tested changes; show code in fenced blocks; name the language; "
        "explain the complexity of an algorithm; never invent library functions. ",
        "verbs": (
            "reverse",
            "sort",
            "parse",
            "serialise",
            "cache",
            "paginate",
            "debounce",
            "profile",
            "mock",
            "refactor",
            "vectorise",
            "deduplicate",
        ),
        "things": (
            "a linked list",
            "a JSON payload",
            "a dictionary of lists",
            "an async generator",
            "a SQL query",
            "a React component",
            "a Python class",
            "a pandas DataFrame",
            "a Rust iterator",
            "a Go channel",
            "a regex",
            "a binary tree",
        ),
        "asks": (
            "How do I {verb} {thing} in {lang}?",
            "Why does my code that tries to {verb} {thing} in {lang} raise an exception?",
            "What is the fastest way to {verb} {thing} using {lang}?",
            "Can you write a unit test that checks I {verb} {thing} correctly in {lang}?",
        ),
        "langs": ("Python", "TypeScript", "Rust", "Go", "Java", "C++", "Kotlin", "SQL"),
    },
    "legal": {
        "teams": (
            "employment",
            "tenancy",
            "contracts",
            "privacy",
            "intellectual property",
            "consumer rights",
            "immigration",
            "family law",
        ),
        "role": "a paralegal who explains statutes, contracts and court procedure in plain words",
        "rules": "Cite the statute or clause you rely on; say which jurisdiction you assume; "
        "separate what the law says from advice; recommend a lawyer for disputes. ",
        "verbs": (
            "terminate",
            "renew",
            "appeal",
            "enforce",
            "dispute",
            "sign",
            "breach",
            "amend",
            "assign",
            "waive",
            "notarise",
            "challenge",
        ),
        "things": (
            "a lease agreement",
            "an employment contract",
            "a non-compete clause",
            "a court judgment",
            "a tenancy deposit claim",
            "a GDPR data request",
            "a trademark registration",
            "a will",
            "a custody order",
            "a consumer refund",
            "a visa refusal",
            "a settlement agreement",
        ),
        "asks": (
            "Can my landlord or employer {verb} {thing} under {lang}?",
            "What are my rights if the other party wants to {verb} {thing} in {lang}?",
            "How long do I have to {verb} {thing} according to {lang}?",
            "Which documents do I need to {verb} {thing} under {lang}?",
        ),
        "langs": (
            "English law",
            "the German civil code",
            "California law",
            "French law",
            "EU regulation",
            "New York law",
            "Irish law",
            "Dutch law",
        ),
    },
}


def head_text(topic: str, team: str) -> str:
    """The system prompt of ``topic``'s assistant for ``team`` (about 350 pseudo-tokens)."""
    spec = TOPICS[topic]
    intro = f"You are the {team} assistant, {spec['role']}. "
    return intro + f"Team {team}: " + str(spec["rules"]) * 6 + "Question: "


@dataclass(frozen=True)
class TopicWorkload:
    """The workload's shape; see the module docstring."""

    windows: int = 12
    requests: int = 64
    change: int | None = 7
    ramp: float = 0.5
    after: float = 0.9
    old: str = "code"
    new: str = "legal"
    seed: int = 0

    def new_share(self, window: int) -> float:
        """Share of the window's requests that ask about the new topic."""
        if self.change is None or window < self.change:
            return 0.0
        return self.ramp if window == self.change else self.after

    def heads(self, topic: str) -> list[str]:
        return [head_text(topic, team) for team in TOPICS[topic]["teams"]]

    def window(self, w: int) -> Iterator[tuple[str, str, str]]:
        """(topic, head, question) of each request of window ``w``, in arrival order."""
        rng = random.Random(f"{self.seed}-{w}")
        for _ in range(self.requests):
            topic = self.new if rng.random() < self.new_share(w) else self.old
            spec = TOPICS[topic]
            teams = spec["teams"]
            weights = [1 / (rank + 1) for rank in range(len(teams))]
            team = rng.choices(teams, weights)[0]
            ask = rng.choice(spec["asks"]).format(
                verb=rng.choice(spec["verbs"]), thing=rng.choice(spec["things"]),
                lang=rng.choice(spec["langs"]),
            )  # fmt: skip
            yield topic, head_text(topic, str(team)), f"{ask} (ticket {rng.randrange(10**6)})"
