"""The demo's generated workload: a few prompt templates with long shared system prompts, and
users' questions to them, interleaved in a fixed (seeded) order."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: product, role, and sentences its system prompt is built from
_TEMPLATES = {
    "billing-support": (
        "a billing support agent for a cloud hosting company",
        [
            "Refunds are issued to the original payment method within ten business days.",
            "Never reveal another customer's invoice, even when asked by an administrator.",
            "Prorated charges apply when a plan is upgraded in the middle of a billing cycle.",
            "Escalate disputed charges above five hundred dollars to a human specialist.",
            "Quote prices in the customer's billing currency and state whether tax is included.",
        ],
    ),
    "sql-assistant": (
        "an assistant that writes PostgreSQL queries for analysts",
        [
            "Use explicit JOIN syntax and qualify every column with its table alias.",
            "Prefer window functions over correlated subqueries for running totals.",
            "Never write DELETE or UPDATE statements; answer with read-only queries only.",
            "Dates are stored in UTC; convert to the analyst's time zone only in the output.",
            "Explain each query in one sentence before the code block.",
        ],
    ),
    "travel-planner": (
        "a travel planner for business trips in Europe",
        [
            "Prefer trains over flights for journeys under four hours door to door.",
            "Hotels must be within twenty minutes of the meeting venue by public transport.",
            "Respect the company travel policy: economy class, no weekend stays unless cheaper.",
            "List visa and entry requirements for the traveller's stated nationality.",
            "Give every itinerary as a numbered list with local departure and arrival times.",
        ],
    ),
    "code-review": (
        "a senior reviewer of Python pull requests",
        [
            "Point out missing tests for every new branch of logic.",
            "Flag functions longer than forty lines and suggest how to split them.",
            "Check that errors are raised with messages naming the input that was wrong.",
            "Prefer standard library solutions over new dependencies.",
            "Summarise the review in three bullet points before the detailed comments.",
        ],
    ),
}
_QUESTIONS = {
    "billing-support": [
        "Why was I charged twice in March?",
        "How do I get a refund for an unused month?",
        "Can I change my billing currency?",
        "What does the prorated line on my invoice mean?",
        "My card was declined, what now?",
        "Do you charge VAT for companies in Germany?",
    ],
    "sql-assistant": [
        "Monthly active users per country for 2024?",
        "Top ten customers by revenue last quarter?",
        "Running total of orders per day?",
        "Which products were never ordered?",
        "Median session length by device type?",
        "Churned customers in the last 90 days?",
    ],
    "travel-planner": [
        "Two days in Lyon next week, meetings near Part-Dieu.",
        "Berlin to Warsaw on Thursday morning?",
        "A day trip from Brussels to Amsterdam?",
        "Three nights in Milan for a trade fair.",
        "Cheapest way from Zurich to Munich?",
        "Hotel near the Vienna convention centre?",
    ],
    "code-review": [
        "Review this retry decorator.",
        "Is this dataclass a good config object?",
        "Review my pandas groupby code.",
        "Should this function be async?",
        "Is catching Exception here fine?",
        "Review the new CLI command.",
    ],
}


@dataclass(frozen=True, slots=True)
class DemoRequest:
    """One chat request of the workload."""

    template: str
    system: str
    question: str

    def messages(self) -> list[dict[str, str]]:
        """The request's chat messages."""
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.question},
        ]


def system_prompt(template: str, sentences: int = 60, seed: int = 7) -> str:
    """A long, fixed system prompt for ``template`` (about 15 pseudo-tokens per sentence)."""
    role, rules = _TEMPLATES[template]
    rng = random.Random(f"{seed}:{template}")
    body = [f"Rule {n + 1}: {rng.choice(rules)}" for n in range(sentences)]
    return f"You are {role}. Follow every rule below.\n" + "\n".join(body)


def generate_workload(
    templates: int = 4, questions: int = 6, sentences: int = 60, seed: int = 7
) -> list[DemoRequest]:
    """``templates`` × ``questions`` requests in a seeded, interleaved order."""
    names = list(_TEMPLATES)[:templates]
    requests = [
        DemoRequest(name, system_prompt(name, sentences, seed), q)
        for name in names
        for q in _QUESTIONS[name][:questions]
    ]
    random.Random(seed).shuffle(requests)
    return requests


def template_of(prefix_text: str | None, requests: list[DemoRequest]) -> str:
    """The template whose system prompt a detected prefix's text starts, or ``?``."""
    for request in requests:
        if prefix_text and request.system[:200] in prefix_text:
            return request.template
    return "?"
