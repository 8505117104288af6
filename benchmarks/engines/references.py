"""Reference warm-ups to compare prewarm against, each run on a freshly started engine.

- ``none``: no warm-up (the control: a deploy as it happens today).
- ``prime_all_seen``: one hand-made ``max_tokens=1`` priming request per template seen in the
  history, in the order the templates first appeared there — what a replay loop does when it
  knows the prefixes but not their value.
- ``resend_logged``: every logged history request sent again, in logged order, with
  ``max_tokens=1`` — the naive "replay the log".
- ``replay_newest``: what operators hand-roll today — group the logged prompts by their head
  (the template), re-send the newest prompt of each group with ``max_tokens=1``, in log order.
- ``oracle``: knows the future. Takes templates in the order of their first use after the restart
  while their whole blocks fit the cache, and primes them in reverse, so the soonest-needed is
  primed last (an LRU cache evicts it last).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from benchmarks.engines.client import PATHS, prime_template, stream
from benchmarks.engines.workload import Template, Workload


@dataclass(frozen=True)
class WarmContext:
    """What a warm-up arm may use. ``capacity_blocks`` is None when the cache holds everything."""

    url: str
    model: str
    workload: Workload
    capacity_blocks: int | None
    block_tokens: int


#: A warm-up arm: warms the engine of ``ctx`` and returns how many requests it sent.
WarmUp = Callable[[WarmContext], int]


def no_warmup(ctx: WarmContext) -> int:
    """The control: nothing is sent before the traffic."""
    return 0


def prime_all_seen(ctx: WarmContext) -> int:
    """Prime every template of the history once, in first-seen order."""
    order = list(dict.fromkeys(r.template for r in ctx.workload.history))
    templates = ctx.workload.templates
    with httpx.Client(base_url=ctx.url, timeout=300.0) as client:
        return len([prime_template(client, templates[i], ctx.model) for i in order])


def resend_logged(ctx: WarmContext) -> int:
    """Send every history request again, in order, with ``max_tokens=1``."""
    w = ctx.workload
    with httpx.Client(base_url=ctx.url, timeout=300.0) as client:
        for request in w.history:
            stream(client, PATHS[request.endpoint], request.body(w.templates, ctx.model, 1))
    return len(w.history)


def replay_newest(ctx: WarmContext) -> int:
    """Re-send the newest logged request of each template, in log order, ``max_tokens=1``."""
    w = ctx.workload
    newest = {request.template: n for n, request in enumerate(w.history)}
    with httpx.Client(base_url=ctx.url, timeout=300.0) as client:
        for n in sorted(newest.values()):
            request = w.history[n]
            stream(client, PATHS[request.endpoint], request.body(w.templates, ctx.model, 1))
    return len(newest)


def template_blocks(client: httpx.Client, template: Template, model: str, block: int) -> int:
    """Whole cache blocks of ``template``'s head as the engine tokenizes it (``/tokenize``)."""
    if template.endpoint == "chat":
        body: dict = {"model": model, "messages": [{"role": "system", "content": template.text}]}
        body["add_generation_prompt"] = False
    else:
        body = {"model": model, "prompt": template.text}
    response = client.post("/tokenize", json=body)
    response.raise_for_status()
    return int(response.json()["count"]) // block


def oracle_order(ctx: WarmContext, client: httpx.Client) -> list[int]:
    """Templates in future first-use order that fit the cache, reversed (soonest last)."""
    w = ctx.workload
    chosen: list[int] = []
    used = 0
    for position in w.first_uses():
        index = w.future[position].template
        blocks = template_blocks(client, w.templates[index], ctx.model, ctx.block_tokens)
        if ctx.capacity_blocks is not None and used + blocks > ctx.capacity_blocks:
            break
        chosen.append(index)
        used += blocks
    return chosen[::-1]


def oracle(ctx: WarmContext) -> int:
    """Prime what the future needs first, within capacity, soonest-needed last."""
    with httpx.Client(base_url=ctx.url, timeout=300.0) as client:
        order = oracle_order(ctx, client)
        for index in order:
            prime_template(client, ctx.workload.templates[index], ctx.model)
    return len(order)


REFERENCES: dict[str, WarmUp] = {
    "none": no_warmup,
    "prime_all_seen": prime_all_seen,
    "resend_logged": resend_logged,
    "replay_newest": replay_newest,
    "oracle": oracle,
}
