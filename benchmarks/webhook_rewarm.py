"""Push-to-warm latency: webhook receipt to commit, for a repository of ``--templates``
templates with one template changed per push.

Everything is real: a git repository in a temporary directory, the webhook app over HTTP
(uvicorn), a Celery worker process, Redis, and the engine simulator primed through the
warm-up WAL (:mod:`benchmarks.rewarm_stack`). Each round edits one template, commits, sends a
signed GitHub push delivery and times until the re-warm record says ``committed``; p50 and p99
over the rounds are the push-to-warm latency. A changed template is primed in both forms its
users send (completions and chat): two items.

The baseline, timed in the same process: a full re-warm of all templates (the repository
state forgotten, the push sent as the branch's first), which is what a cache without template
diffs would have to do on every change. Like every plan, a full re-warm is capped by the
budget (``budget.max_items``, 100 by default): with more than 50 templates it primes the
100 items the planner scores highest, and the numbers say how many it primed.

    python benchmarks/webhook_rewarm.py [--rounds 40] [--templates 100] [--full-rounds 5]
        [--smoke]

``--smoke`` runs tiny sizes (seconds), as the test suite does. Uses the test Redis databases
(``PREWARM_TEST_REDIS_DB``, default 14 and 15) and flushes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.rewarm_stack import REPO, Stack, rewarm_stack  # noqa: E402
from benchmarks.stack import BROKER_URL, STORE_URL, use_benchmark_redis  # noqa: E402
from tasks.settings import BudgetSettings  # noqa: E402

#: items a changed template is primed as: its completions form and its chat form
ITEMS_PER_TEMPLATE = 2

HEAD = "You are assistant number {n} of the Acme support desk. Answer briefly and politely, " * 2


def _templates(count: int) -> dict[str, str]:
    body = (
        "Context: {{ context }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}"
    )
    return {_path(n): HEAD.format(n=n) + body for n in range(count)}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _round(stack: Stack, before: str, files: dict[str, str]) -> tuple[str, float, dict]:
    after = stack.commit(files)
    started = time.perf_counter()
    response = stack.push_webhook(before, after)
    if response.status_code != 202:
        raise RuntimeError(f"webhook answered {response.status_code}: {response.text}")
    record = stack.wait_txn(after, timeout=120)
    elapsed = time.perf_counter() - started
    if record["state"] != "committed":
        raise RuntimeError(f"re-warm did not commit: {record}")
    return after, elapsed, record


def _path(n: int) -> str:
    return f"prompts/team{n % 10}/t{n:03d}.jinja"


def _forget(store: redis.Redis) -> None:
    for key in store.scan_iter(match=f"pw:templates:{REPO}:*"):
        store.delete(key)


def run(rounds: int, count: int, full_rounds: int) -> dict:
    """Run the benchmark; returns the numbers."""
    use_benchmark_redis()
    store = redis.Redis.from_url(STORE_URL)
    redis.Redis.from_url(BROKER_URL).flushdb()
    store.flushdb()
    templates = _templates(count)
    with (
        tempfile.TemporaryDirectory() as tmp,
        rewarm_stack(Path(tmp), STORE_URL, templates) as stack,
    ):
        head, first, record = _round(stack, "0" * 40, {"README.md": "prompts\n"})
        full_items = min(ITEMS_PER_TEMPLATE * count, BudgetSettings().max_items)
        _expect(record, full_items, len(templates), "the first push")
        full = []
        for n in range(full_rounds):
            _forget(store)
            head, elapsed, record = _round(stack, "0" * 40, {"NOTES.md": f"full {n}\n"})
            _expect(record, full_items, len(templates), "a full re-warm")
            full.append(elapsed)
        one = []
        for n in range(rounds):
            path = _path(n % count)
            text = HEAD.format(n=f"{n % count} (rev {n})") + "Context: {{ context }}\n"
            head, elapsed, record = _round(stack, head, {path: text})
            if record["warm"] != [path]:
                raise RuntimeError(f"expected only {path} re-warmed: {record}")
            _expect(record, ITEMS_PER_TEMPLATE, 1, f"a push changing {path}")
            one.append(elapsed)
    return {
        "templates": count,
        "rounds": rounds,
        "one_changed_p50_s": round(statistics.median(one), 4),
        "one_changed_p99_s": round(_quantile(one, 0.99), 4),
        "one_changed_max_s": round(max(one), 4),
        "full_rewarm_rounds": full_rounds,
        "full_rewarm_items": full_items,
        "full_rewarm_p50_s": round(statistics.median(full), 4),
        "full_over_one_changed": round(statistics.median(full) / statistics.median(one), 2),
        "first_push_s": round(first, 4),
    }


def _expect(record: dict, items: int, templates: int, what: str) -> None:
    if record["items"] != items or len(record["warm"]) != templates:
        raise RuntimeError(
            f"{what}: expected {templates} template(s) re-warmed as {items} item(s), got "
            f"{len(record['warm'])} as {record['items']}: {record}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--templates", type=int, default=100)
    parser.add_argument("--full-rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.templates, args.full_rounds = 3, 4, 1
    result = run(args.rounds, args.templates, args.full_rounds)
    result["goal_met"] = result["one_changed_p50_s"] < 2.0 and result["one_changed_p99_s"] < 5.0
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
