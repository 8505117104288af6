"""How many first uses can any warm-up serve from a half-size cache? A model, not the engine.

The ``half`` setting of :mod:`benchmarks.engines.vllm_cold_start` compares prewarm with an oracle
that knows the order in which templates are first used after the restart. This module asks what
a warm-up that does *not* know that order could reach at best, by replaying the same workloads
through a model of vLLM v1's prefix cache instead of the engine (seconds instead of hours, so
many futures can be drawn):

* blocks of 128 tokens, 63 usable (``--num-gpu-blocks-override 64`` less the null block);
* a request reuses the longest run of cached whole blocks of its prompt (never the last token);
  it takes its other blocks from the head of the free queue, evicting what they cached; when it
  finishes, its cached blocks go back to the tail of the queue in reverse order (vLLM frees the
  tail of a prompt first), so the queue is the LRU order, and its uncached blocks (the last
  partial block, the output) to the head, to be reused first (``BlockPool.free_blocks`` of
  vLLM 0.32);
* prompts are tokenised by the engine model's own tokenizer and chat template, one request at a
  time, as the benchmark replays them.

Policies, each priming whole template heads (``max_tokens=1``) before the future is replayed:
``oracle``, ``resend_logged`` and ``prime_all_seen`` as in :mod:`benchmarks.engines.references`;
``frequency`` (history counts, templates seen twice or more, fill the cache, most used primed
last — what prewarm's plan does when the history is one window); and ``known_popularity``: the
same with the workload's true template weights instead of counts — the best a warm-up that knows
the popularity exactly but not the order can do this way. With ``--search``, ``best_static``:
the set of heads with the most first-use hits on other futures drawn from the same popularity,
found by local search — any fixed choice, not only a ranking, evaluated on the same futures.

Futures: the workload's own future, plus ``--futures`` more drawn from the same popularity (the
history stays the one the engine logged). Usage (needs only the model's tokenizer files)::

    python -m benchmarks.engines.cache_model --seeds 8 --futures 12

``--smoke`` runs one seed, one extra future and a short history and future (seconds), as the
test suite does, with the tokenizer of ``build_model.py --smoke``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
from jinja2 import Template as JinjaTemplate

from benchmarks.engines.engine import CPU_BLOCK_TOKENS, vllm_model
from benchmarks.engines.workload import Request, Workload, build_workload
from pipeline.planner.candidates import PlanRequest, candidates, plan_from_candidates
from pipeline.planner.plan import PlanBudget, WarmItem, WarmPlan
from pipeline.records import records_frame

USABLE_BLOCKS = 63


@dataclass
class Tokenizer:
    """The engine model's tokenizer and chat template (what vLLM renders and tokenises)."""

    encode: Callable[[str, bool], list[int]]
    chat_template: JinjaTemplate

    @classmethod
    def load(cls) -> Tokenizer:
        from tokenizers import Tokenizer as HfTokenizer

        model = vllm_model()
        tokenizer = HfTokenizer.from_file(str(model / "tokenizer.json"))
        template = JinjaTemplate((model / "chat_template.jinja").read_text())
        return cls(lambda text, special: tokenizer.encode(text, add_special_tokens=special).ids,
                   template)  # fmt: skip

    def count(self, text: str) -> int:
        return len(self.encode(text, False))

    def render(self, messages: list[dict[str, str]], generation_prompt: bool = True) -> str:
        return self.chat_template.render(messages=messages, bos_token="<s>", eos_token="</s>",
                                         add_generation_prompt=generation_prompt)  # fmt: skip

    def chat(self, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
        return self.encode(self.render(messages, generation_prompt), False)


class FreeQueueCache:
    """vLLM v1's block pool in miniature: cached blocks by chain key, a free queue as LRU."""

    def __init__(self, blocks: int = USABLE_BLOCKS, block_tokens: int = CPU_BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(blocks))
        self.key_of: dict[int, tuple[int, ...]] = {}
        self.block_of: dict[tuple[int, ...], int] = {}

    def _keys(self, ids: Sequence[int]) -> list[tuple[int, ...]]:
        size = self.block_tokens
        return [tuple(ids[: (i + 1) * size]) for i in range(len(ids) // size)]

    def _hit(self, ids: Sequence[int], keys: list[tuple[int, ...]]) -> list[int]:
        hit: list[int] = []
        for key in keys[: (len(ids) - 1) // self.block_tokens]:
            if key not in self.block_of:
                break
            hit.append(self.block_of[key])
        return hit

    def peek(self, ids: Sequence[int]) -> int:
        """Tokens of ``ids`` a request would find cached now (the cache is left as it is)."""
        return len(self._hit(ids, self._keys(ids))) * self.block_tokens

    def request(self, ids: Sequence[int], max_tokens: int) -> int:
        """Serve one request; returns its cached tokens."""
        size = self.block_tokens
        keys = self._keys(ids)
        hit = self._hit(ids, keys)
        for block in hit:
            self.free.pop(block, None)
        fresh = [self._take() for _ in range(math.ceil((len(ids) + max_tokens) / size) - len(hit))]
        blocks = hit + fresh
        for i in range(len(hit), len(keys)):
            if keys[i] not in self.block_of:
                self.block_of[keys[i]], self.key_of[blocks[i]] = blocks[i], keys[i]
        freed = list(reversed(blocks))  # vLLM frees the tail of a request first
        for block in freed:
            self.free[block] = None  # cached blocks: to the tail of the queue (LRU order)
        for block in reversed([b for b in freed if b not in self.key_of]):
            self.free.move_to_end(block, last=False)  # uncached ones: reused first
        return len(hit) * size

    def _take(self) -> int:
        block, _ = self.free.popitem(last=False)
        key = self.key_of.pop(block, None)
        if key is not None:
            del self.block_of[key]
        return block


@dataclass
class Prompts:
    """Token ids of the workload's requests and template heads, as the engine sees them."""

    workload: Workload
    tokenizer: Tokenizer
    usable_blocks: int = USABLE_BLOCKS
    _ids: dict[Request | int, list[int]] = field(default_factory=dict)

    def request(self, request: Request) -> list[int]:
        if request not in self._ids:
            self._ids[request] = self._request(request)
        return self._ids[request]

    def head(self, index: int) -> list[int]:
        if index not in self._ids:
            self._ids[index] = self._head(index)
        return self._ids[index]

    def _request(self, request: Request) -> list[int]:
        head = self.workload.templates[request.template].text
        if request.endpoint == "chat":
            messages = [
                {"role": "system", "content": head},
                {"role": "user", "content": request.user},
            ]
            return self.tokenizer.chat(messages, generation_prompt=True)
        return self.tokenizer.encode(f"{head}\n\nQuestion: {request.user}\nAnswer:", True)

    def _head(self, index: int) -> list[int]:
        template = self.workload.templates[index]
        if template.endpoint == "chat":
            messages = [{"role": "system", "content": template.text}]
            return self.tokenizer.chat(messages, generation_prompt=True)
        return self.tokenizer.encode(template.text, True)

    def blocks(self, index: int) -> int:
        """Blocks a priming request of ``index``'s head takes (with its one output token)."""
        return math.ceil((len(self.head(index)) + 1) / CPU_BLOCK_TOKENS)


Priming = list[list[int]]


def first_use_hits(prompts: Prompts, future: Sequence[Request], priming: Priming) -> int:
    """Replay ``priming`` then ``future`` on an empty cache; count first uses with a hit."""
    cache = FreeQueueCache(prompts.usable_blocks)
    for ids in priming:
        cache.request(ids, 1)
    seen: set[int] = set()
    hits = 0
    for request in future:
        cached = cache.request(prompts.request(request), 4)
        if request.template not in seen:
            seen.add(request.template)
            hits += cached > 0
    return hits


def fill(prompts: Prompts, ranked: Sequence[int]) -> list[int]:
    """Of ``ranked`` (best first), those whose heads fit the cache together, best first."""
    chosen, used = [], 0
    for index in ranked:
        if used + prompts.blocks(index) <= prompts.usable_blocks:
            chosen.append(index)
            used += prompts.blocks(index)
    return chosen


def fill_by_rank(prompts: Prompts, ranked: Sequence[int]) -> Priming:
    """Take ``ranked`` (best first) while their heads fit; prime the best last."""
    return [prompts.head(i) for i in reversed(fill(prompts, ranked))]


def by_popularity(prompts: Prompts) -> list[int]:
    """Template indices, most popular (the workload's true weight) first."""
    templates = prompts.workload.templates
    return sorted(range(len(templates)), key=lambda i: -templates[i].weight)


def oracle(prompts: Prompts, history: Sequence[Request], future: Sequence[Request]) -> Priming:
    chosen, used = [], 0
    for index in dict.fromkeys(r.template for r in future):
        blocks = len(prompts.head(index)) // CPU_BLOCK_TOKENS
        if used + blocks > prompts.usable_blocks:
            break
        chosen.append(index)
        used += blocks
    return [prompts.head(i) for i in reversed(chosen)]


def resend_logged(prompts: Prompts, history: Sequence[Request], _: Sequence[Request]) -> Priming:
    return [prompts.request(r) for r in history]


def prime_all_seen(prompts: Prompts, history: Sequence[Request], _: Sequence[Request]) -> Priming:
    return [prompts.head(i) for i in dict.fromkeys(r.template for r in history)]


def frequency(prompts: Prompts, history: Sequence[Request], _: Sequence[Request]) -> Priming:
    counts = Counter(r.template for r in history)
    ranked = sorted((i for i in counts if counts[i] >= 2), key=lambda i: (-counts[i], i))
    return fill_by_rank(prompts, ranked)


def known_popularity(prompts: Prompts, history: Sequence[Request], _: Sequence[Request]) -> Priming:
    return fill_by_rank(prompts, by_popularity(prompts))


def replay_newest(prompts: Prompts, history: Sequence[Request], _: Sequence[Request]) -> Priming:
    """The hand-rolled replay: group the logged prompts by their head (template), re-send the
    newest prompt of each group, in log order."""
    newest = {r.template: n for n, r in enumerate(history)}
    return [prompts.request(history[n]) for n in sorted(newest.values())]


def history_records(prompts: Prompts, history: Sequence[Request]) -> pd.DataFrame:
    """The history as ``prewarm ingest`` reads it from vLLM's DEBUG log: the prompt as the
    engine rendered it (chat through the model's chat template), the endpoint from the id."""
    start = pd.Timestamp("2026-01-01T00:00:00Z")
    rows = []
    for n, request in enumerate(history):
        head = prompts.workload.templates[request.template].text
        if request.endpoint == "chat":
            messages = [{"role": "system", "content": head},
                        {"role": "user", "content": request.user}]  # fmt: skip
            prompt, endpoint = prompts.tokenizer.render(messages), "/v1/chat/completions"
        else:
            prompt, endpoint = f"{head}\n\nQuestion: {request.user}\nAnswer:", "/v1/completions"
        rows.append({"ts": start + pd.Timedelta(seconds=n), "model": "tiny-llama",
                     "endpoint": endpoint, "prompt": prompt, "source": "vllm"})  # fmt: skip
    return records_frame(rows)


def planner_request(blocks: int) -> PlanRequest:
    """What ``tasks.services.planning.plan_request`` makes of the benchmark's settings file for a
    cache of ``blocks`` blocks (vLLM's null block left out)."""
    budget = PlanBudget(max_items=100, max_tokens=(blocks - 1) * CPU_BLOCK_TOKENS,
                        max_seconds=300.0, concurrency=1, batch_size=4,
                        block_tokens=CPU_BLOCK_TOKENS)  # fmt: skip
    return PlanRequest(engine="vllm-cpu", model="tiny-llama", budget=budget)


def item_ids(prompts: Prompts, item: WarmItem) -> list[int]:
    """Token ids the engine computes for a plan item's priming request."""
    return prompts.tokenizer.encode(item.text or "", bool(item.params.get("add_special_tokens",
                                                                          True)))  # fmt: skip


def plan_of(prompts: Prompts, history: Sequence[Request], blocks: int) -> WarmPlan:
    """prewarm's plan for the history: the one planner, token counts by the model's tokenizer
    (what ``POST /tokenize`` answers in the real run)."""
    request = planner_request(blocks)
    found = candidates(history_records(prompts, history), request)
    counts = {item.key: len(item_ids(prompts, item)) for item in found if item.text is not None}
    return plan_from_candidates(found, request, token_counts=counts)


def prewarm(prompts: Prompts, history: Sequence[Request], _: Sequence[Request]) -> Priming:
    """prewarm's arm: its plan's items, primed in plan order."""
    plan = plan_of(prompts, history, prompts.usable_blocks + 1)
    return [item_ids(prompts, item) for item in plan.items]


POLICIES = {
    "oracle": oracle,
    "resend_logged": resend_logged,
    "prime_all_seen": prime_all_seen,
    "frequency": frequency,
    "known_popularity": known_popularity,
    "replay_newest": replay_newest,
    "prewarm": prewarm,
}


def futures(workload: Workload, extra: int, label: str) -> list[list[Request]]:
    """The workload's own future and ``extra`` more drawn from its popularity."""
    rng = random.Random(label)
    templates = workload.templates
    weights = [t.weight for t in templates]
    drawn = [workload.future]
    for _ in range(extra):
        picks = rng.choices(range(len(templates)), weights=weights, k=len(workload.future))
        drawn.append([Request(i, templates[i].endpoint, r.user)
                      for i, r in zip(picks, workload.future, strict=True)])  # fmt: skip
    return drawn


def best_static(prompts: Prompts, training: Sequence[Sequence[Request]]) -> list[int]:
    """The set of template heads (primed least popular first) with the most first-use hits on
    ``training`` futures, by local search (swap one in or out) from the popularity fill."""
    weights = [t.weight for t in prompts.workload.templates]

    def hits(chosen: Sequence[int]) -> int:
        priming = [prompts.head(i) for i in sorted(chosen, key=lambda i: weights[i])]
        return sum(first_use_hits(prompts, future, priming) for future in training)

    def fits(chosen: Sequence[int]) -> bool:
        return sum(prompts.blocks(i) for i in chosen) <= prompts.usable_blocks

    best = fill(prompts, by_popularity(prompts))
    best_hits, improved = hits(best), True
    while improved:
        improved = False
        for out in [None, *best]:
            for into in (i for i in range(len(weights)) if i not in best):
                trial = [i for i in best if i != out] + [into]
                if fits(trial) and (trial_hits := hits(trial)) > best_hits:
                    best, best_hits, improved = trial, trial_hits, True
    return sorted(best, key=lambda i: weights[i])


def evaluate(
    seeds: int, extra_futures: int, search: bool = False, *, blocks: int = USABLE_BLOCKS + 1,
    n_history: int = 128, n_future: int = 48,
) -> dict:  # fmt: skip
    """First-use hits per policy, summed over seeds and futures, each policy's share of the
    oracle's hits, warm-up prompt tokens per policy, and the futures where prewarm got fewer
    first-use hits than the hand-rolled replay. With ``search``, also the best static set."""
    tokenizer = Tokenizer.load()
    totals: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    per_seed, behind = [], []
    names = [*POLICIES, "best_static"] if search else list(POLICIES)
    for seed in range(seeds):
        workload = build_workload(tokenizer.count, n_history=n_history, n_future=n_future,
                                  seed=seed)  # fmt: skip
        prompts = Prompts(workload, tokenizer, usable_blocks=blocks - 1)
        row: Counter[str] = Counter()
        static = None
        if search:
            training = futures(workload, extra_futures, f"training-{seed}")[1:]
            static = [prompts.head(i) for i in best_static(prompts, training)]
        for n, future in enumerate(futures(workload, extra_futures, f"futures-{seed}")):
            row["first_uses"] += len({r.template for r in future})
            hits = {}
            for name, policy in POLICIES.items():
                priming = policy(prompts, workload.history, future)
                hits[name] = first_use_hits(prompts, future, priming)
                if n == 0:
                    tokens[name] += sum(len(ids) for ids in priming)
            row.update(hits)
            if hits["prewarm"] < hits["replay_newest"]:
                behind.append({"seed": seed, "future": n, **hits})
            if static is not None:
                row["best_static"] += first_use_hits(prompts, future, static)
        per_seed.append({"seed": seed, **row})
        totals.update(row)
    share = {name: round(totals[name] / max(1, totals["oracle"]), 3) for name in names}
    return {"seeds": seeds, "futures_per_seed": extra_futures + 1, "blocks": blocks,
            "totals": dict(totals), "share_of_oracle": share,
            "warm_prompt_tokens_per_seed": {k: round(v / seeds) for k, v in tokens.items()},
            "prewarm_behind_replay": behind, "per_seed": per_seed}  # fmt: skip


def table(result: dict) -> str:
    """The result as a Markdown table: per policy, first-use hits (of all first uses), share of
    the oracle, warm-up prompt tokens per seed (own future)."""
    first = result["totals"]["first_uses"]
    lines = [f"blocks={result['blocks']}  seeds={result['seeds']}  "
             f"futures/seed={result['futures_per_seed']}  first uses={first}",
             "| policy | first-use hits | share of oracle | warm-up prompt tokens / seed |",
             "|---|---|---|---|"]  # fmt: skip
    for name, share in result["share_of_oracle"].items():
        warm = result["warm_prompt_tokens_per_seed"].get(name, "-")
        lines.append(f"| {name} | {result['totals'][name]} | {share} | {warm} |")
    lines.append(f"futures where prewarm < replay_newest: {len(result['prewarm_behind_replay'])}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--futures", type=int, default=12, help="extra futures per seed")
    parser.add_argument("--search", action="store_true", help="also search the best static set")
    parser.add_argument(
        "--blocks",
        type=int,
        default=USABLE_BLOCKS + 1,
        help="cache blocks (--num-gpu-blocks-override; 1024 = the fits setting)",
    )
    parser.add_argument("--history", type=int, default=128)
    parser.add_argument("--future", type=int, default=48)
    parser.add_argument("--json", action="store_true", help="the whole result as JSON")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.futures, args.history, args.future = 1, 1, 16, 8
    result = evaluate(args.seeds, args.futures, args.search, blocks=args.blocks,
                      n_history=args.history, n_future=args.future)  # fmt: skip
    print(json.dumps(result, indent=1) if args.json else table(result))


if __name__ == "__main__":
    main()
