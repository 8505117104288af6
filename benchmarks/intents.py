"""Intents for a semantic cache: CPU seconds to embed and group logged prompts, and what the
warmed entries answer of paraphrases never seen, against the similarity threshold.

A generated log (``--prompts`` requests, by default 10,000): ``--intents`` intents (a question
family × a subject: "reset the password of the billing portal"), each asked in five wordings
with a greeting or a closing or neither, popularity falling as 1/rank. Prompts are embedded
with all-MiniLM-L6-v2 (the loop's :class:`models.topics.PromptEmbedder`: batches, cache by
prompt hash) and grouped two ways:

- ``threshold``: :class:`models.intents.IntentModel` (leader clustering at the threshold);
- ``kmeans``: MiniBatchKMeans given the true number of intents (an oracle the log cannot give).

Per threshold and method, the intents asked at least twice are warmed with their
representative, less those whose representative the wrong-intent check
(:func:`pipeline.intents.collisions.first_collision`) finds within the threshold of another
found intent's logged prompt. Then a sixth wording of every warmed true intent, never logged,
asks once: it is *answered* when its nearest warmed entry is within the threshold (what
LiteLLM's ``redis-semantic`` does), *right* when that entry is of its own intent, *wrong*
otherwise. The columns: entries warmed, intents left cold by the check, hit share (right
answers over the paraphrases asked), wrong answers, and CPU seconds to group.

Usage::

    HF_HUB_OFFLINE=1 python benchmarks/intents.py [--prompts 10000] [--intents 200]
        [--thresholds 0.8 0.85 0.9 0.95] [--seed 0] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.intents import IntentModel
from models.topics import PromptEmbedder, load_minilm
from pipeline.intents.collisions import first_collision

FAMILIES = {
    "reset": (
        "How do I reset the password of {s}?",
        "I forgot my {s} password, how can I set a new one?",
        "What are the steps to change a lost password for {s}?",
        "Can you help me recover access to {s}, I lost the password",
        "Password reset for {s}: how?",
        "My {s} password no longer works, how do I get a new one?",
    ),
    "cancel": (
        "How do I cancel my {s} subscription?",
        "I want to stop paying for {s}, how do I end it?",
        "What is the way to terminate the {s} plan?",
        "Please explain how to unsubscribe from {s}",
        "Cancelling {s}: what do I do?",
        "How can I close my {s} subscription for good?",
    ),
    "price": (
        "How much does {s} cost per month?",
        "What is the monthly price of {s}?",
        "Tell me the fee for {s} each month",
        "What will I pay every month for {s}?",
        "Monthly cost of {s}?",
        "How expensive is {s} per month?",
    ),
    "invoice": (
        "Where can I download my {s} invoice?",
        "How do I get a copy of the bill for {s}?",
        "Where are the invoices for {s} stored?",
        "I need the receipt for {s}, where is it?",
        "Download {s} invoice: where?",
        "How can I find last month's invoice for {s}?",
    ),
    "outage": (
        "Is {s} down right now?",
        "Why is {s} not working today?",
        "Is there an outage affecting {s}?",
        "{s} stopped responding, is it broken for everyone?",
        "Status of {s}: any incident?",
        "Is anyone else having problems with {s} at the moment?",
    ),
    "export": (
        "How do I export my data from {s}?",
        "Can I download everything I stored in {s}?",
        "What is the way to get a full backup of my {s} data?",
        "I want all my {s} records as a file",
        "Export data out of {s}: how?",
        "How can I take my data with me when leaving {s}?",
    ),
    "language": (
        "How do I change the language of {s}?",
        "Can {s} be shown in French instead of English?",
        "Where is the setting to switch the display language in {s}?",
        "I need {s} in another language, how?",
        "Language settings of {s}?",
        "How can I make {s} use my own language?",
    ),
    "delete": (
        "How do I delete my {s} account?",
        "I want to remove my account on {s} permanently",
        "What are the steps to erase my {s} profile?",
        "Please tell me how to close and wipe my {s} account",
        "Delete {s} account: how?",
        "How can I get rid of my {s} account and its data?",
    ),
}
SUBJECTS = (
    "the billing portal", "the mobile app", "the travel booking tool", "the payroll system",
    "the expense tracker", "the HR portal", "the VPN client", "the team calendar",
    "the document archive", "the customer CRM", "the help desk", "the email service",
    "the video conference tool", "the code repository", "the analytics dashboard",
    "the learning platform", "the parking app", "the cafeteria app", "the print service",
    "the wiki", "the chat app", "the file share", "the password manager", "the time sheet",
    "the insurance portal",
)  # fmt: skip
OPENERS = ("", "Hi, ", "Quick question: ")
CLOSERS = ("", " Thanks!", " Please help.")
LOGGED_WORDINGS = 5  # the sixth wording of each family is never logged


@dataclass(frozen=True)
class Prompt:
    intent: int
    text: str


def intents(n: int) -> list[tuple[str, str]]:
    """(family, subject) of ``n`` intents, family by family."""
    pairs = [(f, s) for s in SUBJECTS for f in FAMILIES]
    if n > len(pairs):
        raise SystemExit(f"at most {len(pairs)} intents")
    return pairs[:n]


def wording(intent: tuple[str, str], k: int, rng: random.Random) -> str:
    family, subject = intent
    text = FAMILIES[family][k].format(s=subject)
    return rng.choice(OPENERS) + text + rng.choice(CLOSERS)


def logged(n_prompts: int, pairs: list[tuple[str, str]], rng: random.Random) -> list[Prompt]:
    """The log: intents by 1/rank popularity (ranks shuffled), logged wordings at random."""
    order = list(range(len(pairs)))
    rng.shuffle(order)
    weights = [1.0 / (order.index(i) + 1) for i in range(len(pairs))]
    chosen = rng.choices(range(len(pairs)), weights=weights, k=n_prompts)
    return [Prompt(i, wording(pairs[i], rng.randrange(LOGGED_WORDINGS), rng)) for i in chosen]


def unseen(pairs: list[tuple[str, str]], which: list[int], rng: random.Random) -> list[Prompt]:
    """The sixth wording of each of ``which`` (never logged)."""
    return [Prompt(i, wording(pairs[i], LOGGED_WORDINGS, rng)) for i in which]


def warm(
    method: str,
    threshold: float,
    vectors: np.ndarray,
    uses: np.ndarray,
    n_true: int,
) -> tuple[list[int], int, float]:
    """The texts warmed (indices), the intents left cold by the check, CPU seconds."""
    started = time.process_time()
    model = IntentModel(threshold=threshold, method=method, n_intents=n_true).fit(vectors, uses)
    order = model.representatives(vectors, uses)
    labels = [str(k) for k in model.labels_]
    others = [(label, str(n)) for n, label in enumerate(labels)]
    seconds = time.process_time() - started
    warmed, cold = [], 0
    for k, members in enumerate(order):
        if uses[members].sum() < 2:
            continue
        chosen = next((m for m in members[:3] if first_collision(
            str(k), vectors[m], others, vectors, threshold) is None), None)  # fmt: skip
        if chosen is None:
            cold += 1
        else:
            warmed.append(chosen)
    return warmed, cold, seconds


def answers(
    entries: np.ndarray, entry_intents: list[int], asked: np.ndarray, asked_intents: list[int],
    threshold: float,
) -> tuple[int, int]:  # fmt: skip
    """(right, wrong) answers of the semantic cache holding ``entries`` to ``asked``."""
    if not len(entries):
        return 0, 0
    similarity = asked @ entries.T
    nearest = similarity.argmax(axis=1)
    hit = similarity.max(axis=1) >= threshold
    right = sum(1 for h, n, i in zip(hit, nearest, asked_intents, strict=True)
                if h and entry_intents[n] == i)  # fmt: skip
    return right, int(hit.sum()) - right


def run(args: argparse.Namespace) -> list[dict]:
    rng = random.Random(args.seed)
    pairs = intents(args.intents)
    log = logged(args.prompts, pairs, rng)
    counts = Counter(p.text for p in log)
    texts = sorted(counts)
    truth = {p.text: p.intent for p in log}
    uses = np.array([counts[t] for t in texts], dtype=float)

    encode_started = time.process_time()
    embedder = PromptEmbedder(load_minilm(), batch_size=64)
    loaded = time.process_time() - encode_started
    started = time.process_time()
    vectors = embedder.embed(texts)
    embed_s = time.process_time() - started
    frequent = sorted({truth[t] for t in texts if sum(counts[x] for x in texts
                       if truth[x] == truth[t]) >= 2})  # fmt: skip
    asked = unseen(pairs, frequent, rng)
    asked_vectors = embedder.embed([p.text for p in asked])
    rows = []
    for method in ("threshold", "kmeans"):
        for threshold in args.thresholds:
            n_true = len(set(truth.values()))
            warmed, cold, group_s = warm(method, threshold, vectors, uses, n_true)
            right, wrong = answers(vectors[warmed], [truth[texts[w]] for w in warmed],
                                   asked_vectors, [p.intent for p in asked], threshold)  # fmt: skip
            rows.append({"method": method, "threshold": threshold, "prompts": len(log),
                         "distinct": len(texts), "entries": len(warmed), "cold": cold,
                         "asked": len(asked), "hit_share": round(right / max(1, len(asked)), 3),
                         "wrong": wrong, "group_cpu_s": round(group_s, 2),
                         "embed_cpu_s": round(embed_s, 1),
                         "load_cpu_s": round(loaded, 1)})  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    head = ("method", "threshold", "entries", "cold", "asked", "hit_share", "wrong",
            "group_cpu_s")  # fmt: skip
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    lines += [" | ".join(str(r[h]) for h in head) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--intents", type=int, default=200)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.8, 0.85, 0.9, 0.95])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="300 prompts, 20 intents")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompts, args.intents, args.thresholds = 300, 20, [0.85]
    rows = run(args)
    first = rows[0]
    print(f"{first['prompts']} logged prompts ({first['distinct']} distinct): embedded in "
          f"{first['embed_cpu_s']} CPU s (model load {first['load_cpu_s']} CPU s)")  # fmt: skip
    print(table(rows))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
