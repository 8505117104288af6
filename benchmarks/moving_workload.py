"""Warm-up after a restart on a workload whose popularity moves with the day — on a model of
vLLM's block pool (:class:`benchmarks.engines.cache_model.FreeQueueCache`), not the engine.

Templates (long shared prompt heads, 600-1500 tokens of seeded token ids, each request adding a
15-40-token user part) get their request rates from real ServeGen clients' 10-minute series, one
client per template: the ``--templates`` busiest clients of ``--clients DIR`` (any folder of
ServeGen ``chunk-*-trace.csv`` files), scaled so that a window has ``--requests`` requests on
average. Every window's requests are Poisson draws of those rates in a random order; the draws
before a restart are the history every arm plans from (what the logs hold).

A restart happens at a window ``R`` (``--restarts`` of them per downtime, at random times of day
over the last week of the series), after a downtime of 0, 60 or 180 minutes: the last window
logged is ``R - 1 - downtime``. The engine comes back with an empty cache that holds about half
of a window's working set (the heads of the templates a window uses); each arm primes whole
heads (``max_tokens=1``) or re-sends requests, then window ``R`` is replayed. Arms:

* ``prewarm`` — :class:`models.selection.SelectedForecaster` at the restart's horizon
  (``downtime + 1`` windows ahead), selected by backtest (``--metric``, default first uses: what
  a restart's warm-up saves) on the history before the restart's day (``--refit-days``,
  default 1: retrained daily; 7: one selection on the first week for every restart in the
  second), fills the cache by its forecast from the history up to the last logged window;
* ``resend_logged`` — re-send the last logged window's requests, in their order;
* ``prime_all_seen`` — prime every template seen in the history, most recently used last;
* ``whole_history`` / ``last_window`` — fill by the whole history's / the last logged window's
  counts;
* ``peeking`` — fill by the true request counts of window ``R`` (not their order): the best a
  warm-up that is not clairvoyant can hope for;
* ``true_rate`` — fill by the rate window ``R``'s counts are drawn from (the real client's
  scaled count), not the draw: what a forecaster with no error would know, the bound of any
  forecast from the history;
* ``rate_history`` — prewarm's forecaster, selected and fitted the same way, on a history of
  the rates themselves instead of their draws: no sampling noise in what it learns from, so
  what it misses is the clients' own movement into window ``R``, which no history holds;
* ``oracle`` — clairvoyant: the heads in the order of their first use in window ``R``;
* ``cold`` — no warm-up (what "prefill tokens saved" is counted against).

Every count-based arm (prewarm, both popularities, peeking, true rate, rate history) plans with
the same planner: each template's chance of a first use while its primed head is still
cached — within the first ``s`` of window ``R``, ``s`` the share of a window's working set the
cache holds (:attr:`Workload.survival`, about a half): ``1 - exp(-rate * s)`` from a forecast,
count or rate, ``1 - (1 - s) ** count`` from peeking's known count — taken by chance per cache
block while the heads fit, the likeliest primed last (the block pool is an LRU); only what
they know differs.

Metrics, over the restarts: first uses served from cache (a template's first
request in window ``R`` finds its head cached) and prefill tokens saved in window ``R`` against
the cold start; each arm's first-use hits also as a share of the peeking arm's. Usage::

    python benchmarks/moving_workload.py [--clients DIR] [--restarts 200] [--json F] [--smoke]

``--smoke`` runs tiny sizes (6 templates, 3 restarts after no downtime, one selection): seconds,
as the test suite does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engines.cache_model import FreeQueueCache
from benchmarks.engines.engine import CPU_BLOCK_TOKENS
from benchmarks.engines.restart_replay import engine_first_use_hits, vocabulary
from models.selection import METRICS, SelectedForecaster
from pipeline.evaluation import CountMatrix
from pipeline.ingest.traces import read_servegen

DEFAULT_CLIENTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "servegen"
WINDOW = pd.Timedelta(minutes=10)
PER_DAY = 144
DOWNTIMES_MIN = (0, 60, 180)
NON_PEEKING = ("resend_logged", "prime_all_seen", "whole_history", "last_window")
ARMS = ("prewarm", *NON_PEEKING, "peeking", "true_rate", "rate_history", "oracle", "cold")
#: Arms the real engine replays too (``--engine-restarts``).
ENGINE_ARMS = ("prewarm", "last_window", "peeking", "cold")
VOCABULARY = 32_000
#: the rate history's counts are the rates in hundredths (the forecaster reads whole counts)
RATE_SCALE = 100


@dataclass(frozen=True)
class Templates:
    """Token ids of each template's head, and the clients they follow."""

    heads: list[list[int]]
    clients: list[str]

    def blocks(self, index: int) -> int:
        """Blocks a priming request of the head takes (with its one output token)."""
        return math.ceil((len(self.heads[index]) + 1) / CPU_BLOCK_TOKENS)


@dataclass(frozen=True)
class Workload:
    """Per-window request counts of each template (draws) and the templates."""

    templates: Templates
    counts: np.ndarray  # (templates, windows) int
    start: pd.Timestamp
    capacity: int  # usable blocks of the engine's cache
    rates: np.ndarray  # (templates, windows) the Poisson means the counts are drawn from
    working_blocks: float  # a window's mean working set (heads of the templates it uses)

    @property
    def survival(self) -> float:
        """The share of a window a primed head lasts before the window's misses evict it:
        about the share of a window's working set the cache holds."""
        return min(1.0, self.capacity / max(self.working_blocks, 1.0))

    def matrix(self) -> CountMatrix:
        """The logged counts as the forecaster reads them."""
        return self._matrix(self.counts)

    def rate_matrix(self) -> CountMatrix:
        """The rates the counts are drawn from, as counts (in 1/:data:`RATE_SCALE`)."""
        return self._matrix(np.rint(self.rates * RATE_SCALE).astype(np.int64))

    def _matrix(self, counts: np.ndarray) -> CountMatrix:
        items, windows = np.nonzero(counts)
        frame = pd.DataFrame({
            "item_kind": "template",
            "item_key": [self.templates.clients[i] for i in items],
            "window_start": self.start + WINDOW * windows,
            "requests": counts[items, windows],
        })  # fmt: skip
        return CountMatrix.from_counts(frame, window=WINDOW)


def client_rates(folder: Path, n_templates: int) -> tuple[list[str], np.ndarray, pd.Timestamp]:
    """The ``n_templates`` busiest clients of ``folder`` and their requests per window."""
    counts = read_servegen(folder)
    if counts.empty:
        raise SystemExit(f"{folder}: no ServeGen chunk-*-trace.csv requests")
    matrix = CountMatrix.from_counts(counts, window=WINDOW)
    busiest = np.argsort(-matrix.requests.sum(axis=1), kind="stable")[:n_templates]
    names = [str(k) for k in matrix.items["item_key"].iloc[busiest]]
    return names, matrix.requests[busiest].astype(np.float64), matrix.start


def build_workload(folder: Path, n_templates: int, requests: float, seed: int) -> Workload:
    """Templates following the busiest clients' series, scaled to ``requests`` per window."""
    rng = np.random.default_rng(seed)
    names, rates, start = client_rates(folder, n_templates)
    scale = requests / max(rates.sum(axis=0).mean(), 1e-9)
    counts = rng.poisson(rates * scale)
    heads = [
        [int(x) for x in rng.integers(1, VOCABULARY, size=int(rng.integers(600, 1501)))]
        for _ in names
    ]
    templates = Templates(heads, names)
    used = counts > 0
    working = np.array([sum(templates.blocks(i) for i in np.flatnonzero(c)) for c in used.T])
    mean_working = float(working[working > 0].mean())
    capacity = max(round(mean_working / 2), 14)
    return Workload(templates, counts, start, capacity, rates * scale, mean_working)


def window_requests(workload: Workload, w: int, rng: random.Random) -> list[tuple[int, list[int]]]:
    """Window ``w``'s requests in a random order: (template, prompt token ids)."""
    picks = [i for i, n in enumerate(workload.counts[:, w]) for _ in range(int(n))]
    rng.shuffle(picks)
    users = [[rng.randrange(1, VOCABULARY) for _ in range(rng.randint(15, 40))] for _ in picks]
    return [(i, workload.templates.heads[i] + u) for i, u in zip(picks, users, strict=True)]


def fill_by_value(workload: Workload, value: np.ndarray, rng: random.Random) -> list[list[int]]:
    """The planner every count-based arm shares: ``value`` is each template's chance of a
    first use in the window; templates are taken by value per cache block (a small head that
    will surely be used beats a big one), while they fit, and the most valuable primed last."""
    blocks = np.array([workload.templates.blocks(i) for i in range(len(value))], dtype=float)
    chosen, used = [], 0
    for index in by_score(value / blocks, rng):
        if used + blocks[index] <= workload.capacity:
            chosen.append(index)
            used += int(blocks[index])
    chosen.sort(key=lambda i: value[i])
    return [workload.templates.heads[i] for i in chosen]


def first_use_chance(rate: np.ndarray, survival: float) -> np.ndarray:
    """Chance, at a Poisson ``rate`` per window, of a first use while a primed head is still
    cached: of a request within the first ``survival`` share of the window."""
    return 1.0 - np.exp(-np.maximum(rate, 0.0) * survival)


def known_count_chance(count: np.ndarray, survival: float) -> np.ndarray:
    """The same for a known request count in random order: some request within the first
    ``survival`` share of the window."""
    return 1.0 - (1.0 - survival) ** np.maximum(count, 0.0)


def by_score(scores: np.ndarray, rng: random.Random) -> list[int]:
    """Templates with a positive score, best first (ties in a random order)."""
    keys = {i: rng.random() for i in range(len(scores))}
    return sorted(np.flatnonzero(scores > 0).tolist(), key=lambda i: (-scores[i], keys[i]))


def replay(workload: Workload, priming: Sequence[Sequence[int]], future: Sequence) -> tuple:
    """Prime, then serve ``future``: (first uses with a hit, cached prompt tokens)."""
    cache = FreeQueueCache(blocks=workload.capacity)
    for ids in priming:
        cache.request(ids, 1)
    seen: set[int] = set()
    hits = tokens = 0
    for template, ids in future:
        cached = cache.request(ids, 4)
        tokens += cached
        if template not in seen:
            seen.add(template)
            hits += cached > 0
    return hits, tokens


@dataclass
class Restart:
    """One restart: the window ``R``, the downtime in windows, and the last logged window."""

    window: int
    downtime: int

    @property
    def last_logged(self) -> int:
        return self.window - 1 - self.downtime


def primings(
    workload: Workload,
    restart: Restart,
    forecasts: tuple[np.ndarray, np.ndarray],
    future: list[tuple[int, list[int]]],
    rng: random.Random,
) -> dict[str, list[list[int]]]:
    """What each arm sends before window ``R`` is replayed; ``forecasts``: prewarm's, from the
    counts and from the rates."""
    forecast, from_rates = forecasts
    history = workload.counts[:, : restart.last_logged + 1]
    last = history[:, -1]
    seen_at = np.where(history > 0, np.arange(history.shape[1]), -1).max(axis=1)
    recent_first = by_score(seen_at + 1.0, rng)
    logged = window_requests(workload, restart.last_logged, random.Random(rng.random()))
    truth = workload.counts[:, restart.window].astype(float)
    first_use = list(dict.fromkeys(t for t, _ in future))
    mean_rate = history.sum(axis=1) / history.shape[1]
    rate, keep = workload.rates[:, restart.window], workload.survival
    return {
        "prewarm": fill_by_value(workload, first_use_chance(forecast, keep), rng),
        "resend_logged": [ids for _, ids in logged],
        "prime_all_seen": [workload.templates.heads[i] for i in reversed(recent_first)],
        "whole_history": fill_by_value(workload, first_use_chance(mean_rate, keep), rng),
        "last_window": fill_by_value(workload, first_use_chance(last.astype(float), keep), rng),
        "peeking": fill_by_value(workload, known_count_chance(truth, keep), rng),
        "true_rate": fill_by_value(workload, first_use_chance(rate, keep), rng),
        "rate_history": fill_by_value(workload, first_use_chance(from_rates, keep), rng),
        "oracle": _oracle(workload, first_use),
        "cold": [],
    }


def _oracle(workload: Workload, first_use: Sequence[int]) -> list[list[int]]:
    """Heads in first-use order while they fit (stops at the first that does not)."""
    chosen, used = [], 0
    for index in first_use:
        blocks = workload.templates.blocks(index)
        if used + blocks > workload.capacity:
            break
        chosen.append(index)
        used += blocks
    return [workload.templates.heads[i] for i in reversed(chosen)]


class Forecasts:
    """prewarm's forecasts: one selection per (day, horizon), fitted on the days before."""

    def __init__(
        self,
        matrix: CountMatrix,
        clients: list[str],
        budget: tuple[int, ...],
        refit_days: int,
        metric: str,
        scale: float = 1.0,
    ) -> None:
        self.matrix = matrix
        self.scale = scale  # counts per request in ``matrix``
        self.metric = metric
        self.refit_days = refit_days
        self.order = _item_order(self.matrix, clients)
        self.budget = budget
        self.selected: dict[tuple[int, int], SelectedForecaster] = {}
        self.seconds: list[float] = []

    def at(self, restart: Restart) -> np.ndarray:
        """Predicted requests of each template in window ``R``."""
        horizon = restart.downtime + 1
        day = restart.last_logged // PER_DAY
        day -= (day - 7) % self.refit_days  # the first day of the restart's stretch
        key = (day, horizon)
        if key not in self.selected:
            started = time.perf_counter()
            until = day * PER_DAY - 1  # the history before that stretch
            selected = SelectedForecaster(self.budget, horizon=horizon, metric=self.metric)
            self.selected[key] = selected.fit(self.matrix, until)
            self.seconds.append(time.perf_counter() - started)
        items = np.arange(self.matrix.n_items)
        t = restart.last_logged
        predicted = self.selected[key].predict_at(self.matrix, t, items, horizon)
        out = np.zeros(len(self.order))
        out[self.order] = predicted / self.scale
        return out

    def winners(self) -> dict[int, dict[str, int]]:
        """Per downtime (minutes): how often each candidate won."""
        found: dict[int, dict[str, int]] = {}
        for (_, horizon), model in self.selected.items():
            per = found.setdefault((horizon - 1) * 10, {})
            per[model.winner_name_] = per.get(model.winner_name_, 0) + 1
        return found


def _item_order(matrix: CountMatrix, clients: list[str]) -> np.ndarray:
    """Template index of each matrix item."""
    position = {name: i for i, name in enumerate(clients)}
    return np.array([position[k] for k in matrix.items["item_key"]], dtype=np.int64)


def restarts(workload: Workload, n: int, downtime: int, seed: int) -> list[Restart]:
    """``n`` restart windows over the last week (a week of history before each)."""
    rng = random.Random(f"{seed}-{downtime}")
    first, last = 7 * PER_DAY + downtime + 1, workload.counts.shape[1] - 1
    return [Restart(rng.randint(first, last), downtime) for _ in range(n)]


def run(args: argparse.Namespace) -> dict[str, object]:
    """Every arm on every restart; totals per downtime."""
    workload = build_workload(args.clients, args.templates, args.requests, args.seed)
    mean_blocks = np.mean([workload.templates.blocks(i) for i in range(args.templates)])
    fits = max(1, int(workload.capacity // mean_blocks))  # heads of a mean size that fit
    budget = tuple(max(1, round(fits * x)) for x in args.budget_multiples)
    clients = workload.templates.clients
    forecasts = Forecasts(workload.matrix(), clients, budget, args.refit_days, args.metric)
    from_rates = Forecasts(
        workload.rate_matrix(), clients, budget, args.refit_days, args.metric, RATE_SCALE
    )
    per_downtime: dict[int, dict[str, object]] = {}
    with engine_session(args, workload) as engine:
        for minutes in args.downtimes:
            per_downtime[minutes] = run_downtime(
                args, workload, (forecasts, from_rates), minutes, engine
            )
    results: dict[str, object] = {"clients": str(args.clients), "templates": args.templates,
                                  "capacity_blocks": workload.capacity,
                                  "per_downtime": per_downtime}  # fmt: skip
    results["winners"] = forecasts.winners()
    results["rate_history_winners"] = from_rates.winners()
    results["selection_seconds"] = {"n": len(forecasts.seconds),
                                    "max": max(forecasts.seconds, default=0.0)}  # fmt: skip
    return results


@contextlib.contextmanager
def engine_session(args: argparse.Namespace, workload: Workload) -> Iterator[EngineCheck | None]:
    """A real vLLM CPU server capped at the model's cache (``--engine-restarts`` > 0), else None."""
    if args.engine_restarts <= 0:
        yield None
        return
    from benchmarks.engines.engine import VllmServer, missing_prerequisites, vllm_model
    from jobs.embedded import free_port

    missing = missing_prerequisites()
    if missing:
        raise SystemExit(f"--engine-restarts: {missing}")
    log = Path(args.engine_log)
    server = VllmServer(free_port(), log, gpu_blocks=workload.capacity + 1, dev_mode=True)
    with server, httpx.Client(base_url=server.url, timeout=600.0) as client:
        yield EngineCheck(client, vocabulary(vllm_model()), args.engine_restarts)


@dataclass
class EngineCheck:
    """The first ``restarts`` restarts of each downtime, also on the engine, for some arms."""

    client: httpx.Client
    vocab: int
    restarts: int
    arms: tuple[str, ...] = ENGINE_ARMS

    def hits(
        self, n: int, arm: str, priming: Sequence[Sequence[int]], future: Sequence
    ) -> int | None:
        """The engine's first-use hits for restart ``n``'s ``arm`` (None: not checked)."""
        if n >= self.restarts or arm not in self.arms:
            return None
        return engine_first_use_hits(self.client, priming, future, self.vocab)


def run_downtime(
    args: argparse.Namespace,
    workload: Workload,
    forecasts: tuple[Forecasts, Forecasts],
    minutes: int,
    engine: EngineCheck | None,
) -> dict[str, object]:
    """Every arm on every restart after ``minutes`` of downtime: their totals."""
    totals = dict.fromkeys([*ARMS, "first_uses"], 0.0)
    tokens = dict.fromkeys(ARMS, 0.0)
    agreement: dict[str, list[int]] = {}  # arm -> [engine hits, model hits] where checked
    for n, restart in enumerate(restarts(workload, args.restarts, minutes // 10, args.seed)):
        rng = random.Random(f"{args.seed}-{minutes}-{n}")
        future = window_requests(workload, restart.window, rng)
        totals["first_uses"] += len({t for t, _ in future})
        predicted = (forecasts[0].at(restart), forecasts[1].at(restart))
        plans = primings(workload, restart, predicted, future, rng)
        for arm, priming in plans.items():
            hits, cached = replay(workload, priming, future)
            totals[arm] += hits
            tokens[arm] += cached
            on_engine = engine.hits(n, arm, priming, future) if engine else None
            if on_engine is not None:
                pair = agreement.setdefault(arm, [0, 0])
                pair[0] += on_engine
                pair[1] += hits
    saved = {arm: tokens[arm] - tokens["cold"] for arm in ARMS}
    row: dict[str, object] = {"restarts": args.restarts, "first_use_hits": totals,
                              "prefill_tokens_saved": saved}  # fmt: skip
    if engine is not None:
        row["engine_check"] = {"restarts": min(engine.restarts, args.restarts),
                               "first_use_hits_engine_model": agreement}  # fmt: skip
    return row


def goals(row: dict[str, float]) -> dict[str, bool]:
    """The benchmark's goals for one downtime's totals."""
    best_other = max(row[arm] for arm in NON_PEEKING)
    return {
        "at_least_best_non_peeking": row["prewarm"] >= best_other,
        "above_every_non_peeking": row["prewarm"] > best_other,
        "at_least_90pct_of_peeking": row["prewarm"] >= 0.9 * row["peeking"],
    }


def print_results(console: Console, results: dict[str, object]) -> None:
    """One table: first-use hits and prefill tokens saved per arm and downtime."""
    per = results["per_downtime"]
    assert isinstance(per, dict)
    title = (f"moving workload on the block-pool model (a model of vLLM, not the engine): "
             f"{results['templates']} templates from {results['clients']}, cache "
             f"{results['capacity_blocks']} blocks")  # fmt: skip
    out = Table(title=title)
    out.add_column("arm")
    for minutes in per:
        out.add_column(f"{minutes} min: first-use hits", justify="right")
        out.add_column("of peeking", justify="right")
        out.add_column("tokens saved", justify="right")
    for arm in ARMS[:-1]:
        cells = []
        for row in per.values():
            hits, peek = row["first_use_hits"][arm], row["first_use_hits"]["peeking"]
            cells += [f"{hits:,.0f}", f"{hits / max(peek, 1):.1%}",
                      f"{row['prefill_tokens_saved'][arm]:,.0f}"]  # fmt: skip
        out.add_row(arm, *cells)
    console.print(out)
    for minutes, row in per.items():
        hits = row["first_use_hits"]
        bound = hits["true_rate"] / max(hits["peeking"], 1)
        clean = hits["rate_history"] / max(hits["peeking"], 1)
        console.print(f"downtime {minutes} min: {row['restarts']} restarts, "
                      f"{hits['first_uses']:,.0f} first uses; goals {goals(hits)}; a forecast "
                      f"with no error (true_rate) reaches {bound:.1%} of peeking, prewarm's "
                      f"forecaster on a history with no sampling noise (rate_history) "
                      f"{clean:.1%}")  # fmt: skip
    for minutes, row in per.items():
        check = row.get("engine_check")
        if check:
            pairs = ", ".join(f"{arm} {e}/{m}" for arm, (e, m) in
                              check["first_use_hits_engine_model"].items())  # fmt: skip
            console.print(f"downtime {minutes} min, first {check['restarts']} restart(s) on the "
                          f"real vLLM — first-use hits, engine/model: {pairs}")  # fmt: skip
    console.print(f"on the rate history: {results['rate_history_winners']}")
    console.print(f"prewarm's backtest winners per downtime: {results['winners']}; "
                  f"selections: {results['selection_seconds']}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=Path, default=DEFAULT_CLIENTS / "m-large")
    parser.add_argument("--templates", type=int, default=24)
    parser.add_argument("--requests", type=float, default=60.0, help="mean requests per window")
    parser.add_argument("--restarts", type=int, default=200, help="per downtime")
    parser.add_argument("--downtimes", type=int, nargs="+", default=list(DOWNTIMES_MIN))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-multiples", type=float, nargs="+", default=[1.0],
                        help="prewarm selects at these multiples of what fits")  # fmt: skip
    parser.add_argument("--refit-days", type=int, default=1, help="days between selections")
    parser.add_argument(
        "--metric",
        choices=sorted(METRICS),
        default="first_uses",
        help="what prewarm's backtest scores (a restart warm-up saves first uses)",
    )
    parser.add_argument(
        "--engine-restarts",
        type=int,
        default=0,
        help="per downtime, replay the first N restarts' arms on a real vLLM too",
    )
    parser.add_argument("--engine-log", default="/tmp/prewarm-moving-vllm.log")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.templates, args.restarts, args.downtimes, args.refit_days = 6, 3, [0], 7
    if not args.clients.is_dir():
        parser.error(f"--clients {args.clients}: not a folder")
    results = run(args)
    print_results(Console(width=160), results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
