"""Webhook receipt to commit, for a 100-template repository with one template changed.

Everything is real: a git repository in a temporary directory, the webhook app over HTTP
(uvicorn), a Celery worker process, Redis, and the engine simulator primed through the
warm-up WAL. Each round edits one template, commits, sends a signed GitHub push delivery and
times until the re-warm record says ``committed``.

The baseline, timed in the same process: a full re-warm of all templates (the repository
state forgotten, the push sent as the branch's first), which is what a cache without template
diffs would have to do on every change.

    python benchmarks/webhook_rewarm.py [--rounds 40] [--templates 100] [--full-rounds 5]

Uses the test Redis databases (``PREWARM_TEST_REDIS_DB``, default 14 and 15) and flushes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.stack import BROKER_URL, STORE_URL  # noqa: E402

os.environ["PREWARM_REDIS_URL"] = BROKER_URL
os.environ["PREWARM_STORE_URL"] = STORE_URL

from benchmarks.rewarm_stack import REPO, Stack, rewarm_stack  # noqa: E402

HEAD = "You are assistant number {n} of the Acme support desk. Answer briefly and politely, " * 2


def _templates(count: int) -> dict[str, str]:
    body = (
        "Context: {{ context }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}"
    )
    return {f"prompts/team{n % 10}/t{n:03d}.jinja": HEAD.format(n=n) + body for n in range(count)}


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


def _forget(store: redis.Redis) -> None:
    for key in store.scan_iter(match=f"pw:templates:{REPO}:*"):
        store.delete(key)


def run(rounds: int, count: int, full_rounds: int) -> dict:
    """Run the benchmark; returns the numbers."""
    store = redis.Redis.from_url(STORE_URL)
    redis.Redis.from_url(BROKER_URL).flushdb()
    store.flushdb()
    templates = _templates(count)
    with (
        tempfile.TemporaryDirectory() as tmp,
        rewarm_stack(Path(tmp), STORE_URL, templates) as stack,
    ):
        head, first, record = _round(stack, "0" * 40, {"README.md": "prompts\n"})
        assert record["items"] == count, record
        full = []
        for n in range(full_rounds):
            _forget(store)
            head, elapsed, record = _round(stack, "0" * 40, {"NOTES.md": f"full {n}\n"})
            full.append(elapsed)
        one = []
        for n in range(rounds):
            path = f"prompts/team{n % 10}/t{n % count:03d}.jinja"
            text = HEAD.format(n=f"{n % count} (rev {n})") + "Context: {{ context }}\n"
            head, elapsed, record = _round(stack, head, {path: text})
            if record["warm"] != [path] or record["items"] != 1:
                raise RuntimeError(f"expected only {path} re-warmed: {record}")
            one.append(elapsed)
    return {
        "templates": count,
        "rounds": rounds,
        "one_changed_p50_s": round(statistics.median(one), 4),
        "one_changed_p99_s": round(_quantile(one, 0.99), 4),
        "one_changed_max_s": round(max(one), 4),
        "full_rewarm_rounds": full_rounds,
        "full_rewarm_p50_s": round(statistics.median(full), 4),
        "full_over_one_changed": round(statistics.median(full) / statistics.median(one), 2),
        "first_push_s": round(first, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--templates", type=int, default=100)
    parser.add_argument("--full-rounds", type=int, default=5)
    args = parser.parse_args()
    result = run(args.rounds, args.templates, args.full_rounds)
    result["goal_met"] = result["one_changed_p50_s"] < 2.0 and result["one_changed_p99_s"] < 5.0
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
