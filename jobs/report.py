"""``prewarm report``: one self-contained HTML page per engine and period — does warm-up pay?

It reads the engine's history from the store Redis (:mod:`tasks.adapters.telemetry`: engine reads,
plans, batches, restarts, closed windows) and draws, as PNG images embedded in the page (no
script, no network; the page's Content-Security-Policy allows only inline images and styles):
the engine's prefix-cache hit rate and median time to first token with every warm-up and
restart marked, a before/after table around each of them, warm coverage per window, the
forecast against what came, the misses explained by cause, and the busiest items.
"""

from __future__ import annotations

import base64
import bisect
import io
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import jinja2
import typer

from pipeline.errors import BadInputError
from pipeline.window_outcome import MISS_CAUSES, WindowOutcome
from tasks.adapters.store import Store

if TYPE_CHECKING:
    from matplotlib.axes import Axes

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
#: A week of engine reads every 10 s is 60,480 points and of 5-minute windows 2,016 bars: plots
#: show at most this many (means over equal stretches of time; windows merged in order).
MAX_POINTS = 600
MAX_BARS = 42
#: Warm-ups marked on the plots and rows of the before/after table, at most (the latest).
MAX_MARKS = 40
COLORS = {"plan": "#2e7d32", "restart": "#c62828"}
CAUSE_COLORS = dict(
    zip(MISS_CAUSES, ("#8d6e63", "#ef6c00", "#c62828", "#fbc02d", "#5c6bc0"), strict=True)
)


@dataclass
class ReportData:
    """An engine's history over a period, split by kind of event."""

    engine: str
    since: float
    until: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    windows: list[WindowOutcome] = field(default_factory=list)
    #: what the engine's gateways answered from their cache, per window of requests
    gateway: list[dict[str, Any]] = field(default_factory=list)
    #: a semantic gateway's requests and cache hits per intent and window
    intents: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_events(
        cls, engine: str, since: float, until: float, events: list[dict[str, Any]]
    ) -> ReportData:
        data = cls(engine, since, until)
        lists = {"sample": data.samples, "plan": data.plans, "batch": data.batches,
                 "restart": data.restarts, "gateway": data.gateway,
                 "intent": data.intents}  # fmt: skip
        for event in events:
            if event["kind"] == "window":
                data.windows.append(WindowOutcome.from_dict(event))
            elif event["kind"] in lists:
                lists[event["kind"]].append(event)
        return data

    def markers(self, most: int = MAX_MARKS) -> list[tuple[float, str, str]]:
        """(time, kind, label) of every restart and warm-up, in time order; past ``most``, the
        loop's own per-window plans are left out first, then the oldest."""
        plans = self.plans
        if len(plans) + len(self.restarts) > most:
            plans = [p for p in plans if p["reason"] != "window"]
        marks = [(p["ts"], "plan", f"warm-up ({p['reason']}, {p['items']} items)")
                 for p in plans]  # fmt: skip
        marks += [(r["ts"], "restart", "engine restart") for r in self.restarts]
        return sorted(marks)[-most:]


def load(store: Store, engine: str, since: float, until: float) -> ReportData:
    """The history of ``engine`` between ``since`` and ``until`` (Unix seconds)."""
    from tasks.adapters import telemetry

    return ReportData.from_events(
        engine, since, until, telemetry.history(store, engine, since, until)
    )


# -- plots ---------------------------------------------------------------------------------
def _when(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _png(draw: Callable[[Axes], None], height: float = 3.2) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(9, height), dpi=100)
    try:
        draw(axis)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _x(ts: float) -> float:
    """Matplotlib's date number of a Unix time (the axis shows it as a UTC time)."""
    from matplotlib.dates import date2num

    return float(date2num(_when(ts)))


def _mark(axis: Axes, data: ReportData) -> None:
    for ts, kind, _ in data.markers():
        axis.axvline(_x(ts), color=COLORS[kind], linestyle="--", linewidth=1)


def thinned(points: list[tuple[float, float]], most: int = MAX_POINTS) -> list[tuple[float, float]]:
    """``points`` (time, value), or the means of ``most`` equal stretches of time when longer."""
    if len(points) <= most:
        return points
    start, span = points[0][0], (points[-1][0] - points[0][0]) or 1.0
    bins: dict[int, list[tuple[float, float]]] = {}
    for t, v in points:
        bins.setdefault(min(most - 1, int((t - start) / span * most)), []).append((t, v))
    return [(statistics.fmean(t for t, _ in b), statistics.fmean(v for _, v in b))
            for _, b in sorted(bins.items())]  # fmt: skip


def merged_windows(windows: list[WindowOutcome], most: int = MAX_BARS) -> list[WindowOutcome]:
    """``windows``, or runs of consecutive ones merged (sums) so that at most ``most`` remain."""
    if len(windows) <= most:
        return windows
    size = -(-len(windows) // most)
    return [_merge(windows[i : i + size]) for i in range(0, len(windows), size)]


def _merge(run: list[WindowOutcome]) -> WindowOutcome:
    predicted = [w.predicted for w in run if w.predicted is not None]
    errors = [w.absolute_error for w in run if w.absolute_error is not None]
    return WindowOutcome(
        run[0].window_start, run[-1].window_end, sum(w.requests for w in run),
        sum(w.covered for w in run),
        {c: sum(w.misses.get(c, 0) for w in run) for c in MISS_CAUSES},
        sum(predicted) if predicted else None, sum(errors) if errors else None,
    )  # fmt: skip


def _series(axis: Axes, data: ReportData, field_name: str, label: str, scale: float) -> None:
    raw = [(s["ts"], s[field_name]) for s in data.samples if s.get(field_name) is not None]
    points = thinned(raw)
    if points:
        style = "o-" if len(points) <= 100 else "-"
        axis.plot([_x(t) for t, _ in points], [v * scale for _, v in points], style, label=label)
        axis.xaxis_date(tz=UTC)
    else:
        axis.text(0.5, 0.5, "no engine reads in this period", ha="center", transform=axis.transAxes)
    _mark(axis, data)
    axis.set_ylabel(label)
    axis.set_title(f"{label} (green: warm-ups, red: restarts)")


def hit_rate_plot(data: ReportData) -> str:
    """The engine's prefix-cache hit rate between reads, warm-ups and restarts marked."""
    return _png(lambda ax: _series(ax, data, "hit_rate", "prefix-cache hit rate (%)", 100))


def ttft_plot(data: ReportData) -> str:
    """The engine's median time to first token between reads."""
    return _png(lambda ax: _series(ax, data, "ttft_p50_s", "median TTFT (ms)", 1000))


def _window_labels(windows: list[WindowOutcome]) -> list[str]:
    return [_when(w.window_start).strftime("%m-%d %H:%M:%S") for w in windows]


def _bars(axis: Axes, labels: Sequence[str], values: Sequence[float], **style: Any) -> None:
    if labels:
        axis.bar(labels, values, **style)
        axis.tick_params(axis="x", labelrotation=30, labelsize=7)
    else:
        axis.text(
            0.5, 0.5, "no closed windows in this period", ha="center", transform=axis.transAxes
        )


def coverage_plot(data: ReportData) -> str:
    """Share of each window's requests whose item was warm when it began."""

    def draw(axis: Axes) -> None:
        windows = merged_windows(data.windows)
        values = [100 * (w.coverage or 0.0) for w in windows]
        _bars(axis, _window_labels(windows), values, color="#1565c0")
        axis.set_ylim(0, 100)
        axis.set_ylabel("warm coverage (%)")
        axis.set_title("Requests whose prefix was warm when the window began")

    return _png(draw)


def forecast_plot(data: ReportData) -> str:
    """Predicted against observed requests per window."""

    def draw(axis: Axes) -> None:
        windows = merged_windows(data.windows)
        labels = _window_labels(windows)
        _bars(axis, labels, [w.requests for w in windows], color="#90caf9", label="observed")
        predicted = [(lab, w.predicted) for lab, w in zip(labels, windows, strict=True)
                     if w.predicted is not None]  # fmt: skip
        if predicted:
            axis.plot([p[0] for p in predicted], [p[1] for p in predicted], "kD-", label="forecast")
        axis.set_ylabel("requests")
        axis.set_title("Forecast against observed requests, per window")
        if labels:
            axis.legend(fontsize="small", loc="upper right")

    return _png(draw)


def misses_plot(data: ReportData) -> str:
    """The misses of each window, stacked by cause."""

    def draw(axis: Axes) -> None:
        windows = merged_windows(data.windows)
        labels = _window_labels(windows)
        bottom = [0.0] * len(labels)
        for cause in MISS_CAUSES:
            values = [float(w.misses.get(cause, 0)) for w in windows]
            _bars(axis, labels, values, bottom=bottom, color=CAUSE_COLORS[cause],
                  label=cause.replace("_", " "))  # fmt: skip
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        axis.set_ylabel("requests not warm")
        axis.set_title("Misses explained")
        if labels:
            axis.legend(fontsize="small", loc="upper right")

    return _png(draw)


def top_items(data: ReportData, n: int = 10) -> list[tuple[str, int, int]]:
    """(item, requests, requests while warm) of the busiest items over the period's windows."""
    totals: dict[str, list[int]] = {}
    for window in data.windows:
        for key, count, warm in window.top:
            row = totals.setdefault(key, [0, 0])
            row[0] += count
            row[1] += count if warm else 0
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))[:n]
    return [(key, req, warm) for key, (req, warm) in ranked]


def top_plot(data: ReportData) -> str:
    """The busiest items and how many of their requests found them warm."""

    def draw(axis: Axes) -> None:
        rows = top_items(data)[::-1]
        if not rows:
            axis.text(0.5, 0.5, "no closed windows in this period", ha="center",
                      transform=axis.transAxes)  # fmt: skip
            return
        names = [key if len(key) <= 40 else key[:37] + "…" for key, _, _ in rows]
        axis.barh(names, [r[1] for r in rows], color="#cfd8dc", label="requests")
        axis.barh(names, [r[2] for r in rows], color="#2e7d32", label="of them warm")
        axis.tick_params(axis="y", labelsize=7)
        axis.set_title("Busiest items (templates and prefixes)")
        axis.legend(fontsize="small", loc="lower right")

    return _png(draw, height=4.0)


# -- tables --------------------------------------------------------------------------------
def _summary(values: list[float], how: Callable[[list[float]], float]) -> float | None:
    return how(values) if values else None


def gateway_share(events: Sequence[dict[str, Any]]) -> float | None:
    """Share of the gateway requests of ``events`` answered from the gateway's cache."""
    requests = sum(int(e["requests"]) for e in events)
    return sum(int(e["hits"]) for e in events) / requests if requests else None


def before_after(data: ReportData) -> list[dict[str, Any]]:
    """Around each warm-up and restart: mean hit rate and median TTFT of the engine reads, and
    the share of gateway requests its cache answered, since the previous marker and until the
    next one (a gateway's requests by the window they came in)."""
    marks = data.markers()
    edges = [data.since, *[m[0] for m in marks], data.until]
    times = [s["ts"] for s in data.samples]  # history is in time order
    windows = sorted(data.gateway, key=lambda e: e["ts"])
    starts = [e["ts"] for e in windows]
    rows = []
    for i, (ts, kind, label) in enumerate(marks):
        lo, mid, hi = (bisect.bisect_right(times, t) for t in (edges[i], ts, edges[i + 2]))
        before, after = data.samples[lo:mid], data.samples[mid:hi]
        g_lo, g_mid, g_hi = (bisect.bisect_left(starts, t) for t in (edges[i], ts, edges[i + 2]))

        def stats(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
            rates = [r["hit_rate"] for r in rows if r.get("hit_rate") is not None]
            ttfts = [r["ttft_p50_s"] for r in rows if r.get("ttft_p50_s") is not None]
            return _summary(rates, statistics.fmean), _summary(ttfts, statistics.median)

        rows.append({"when": _when(ts), "kind": kind, "label": label,
                     "before": stats(before), "after": stats(after),
                     "gateway_before": gateway_share(windows[g_lo:g_mid]),
                     "gateway_after": gateway_share(windows[g_mid:g_hi])})  # fmt: skip
    return rows


def intent_shares(data: ReportData) -> list[dict[str, Any]]:
    """Per intent of a semantic gateway, the share of its requests the gateway's cache answered
    before the last window recorded (the windows before the latest warm-up) and in it; the
    busiest intents first."""
    if not data.intents:
        return []
    last = max(e["ts"] for e in data.intents)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for event in data.intents:
        row = rows.setdefault(
            (event["gateway"], event["intent"]),
            {"gateway": event["gateway"], "label": event["label"], "before": [], "after": []},
        )
        row["after" if event["ts"] == last else "before"].append(event)
    out = [{**r, "requests": sum(int(e["requests"]) for e in r["before"] + r["after"]),
            "before": gateway_share(r["before"]), "after": gateway_share(r["after"])}
           for r in rows.values()]  # fmt: skip
    return sorted(out, key=lambda r: -r["requests"])


def totals(data: ReportData) -> dict[str, Any]:
    """Headline numbers of the period."""
    requests = sum(w.requests for w in data.windows)
    covered = sum(w.covered for w in data.windows)
    misses = {c: sum(w.misses.get(c, 0) for w in data.windows) for c in MISS_CAUSES}
    reasons: dict[str, int] = {}
    for plan in data.plans:
        reasons[plan["reason"]] = reasons.get(plan["reason"], 0) + 1
    return {
        "plans": len(data.plans),
        "reasons": reasons,
        "items_planned": sum(int(p["items"]) for p in data.plans),
        "verified": sum(int(b["ok"]) for b in data.batches if b["state"] == "committed"),
        "failed": sum(int(b["failed"]) for b in data.batches),
        "committed": sum(1 for b in data.batches if b["state"] == "committed"),
        "rolled_back": sum(1 for b in data.batches if b["state"] != "committed"),
        "restarts": len(data.restarts),
        "requests": requests,
        "coverage": covered / requests if requests else None,
        "misses": misses,
        "gateway_requests": sum(int(e["requests"]) for e in data.gateway),
        "gateway_hit_rate": gateway_share(data.gateway),
    }


@lru_cache(maxsize=1)
def page() -> jinja2.Template:
    """The page's template (next to this module, shipped as package data)."""
    loader = jinja2.FileSystemLoader(Path(__file__).parent)
    return jinja2.Environment(loader=loader, autoescape=True).get_template("report.html.jinja")


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:,.0f} ms"


def render(data: ReportData, now: float | None = None) -> str:
    """The whole page as HTML text."""
    plots = [
        ("plot-hit-rate", "prefix-cache hit rate", hit_rate_plot(data)),
        ("plot-ttft", "median time to first token", ttft_plot(data)),
        ("plot-coverage", "warm coverage per window", coverage_plot(data)),
        ("plot-forecast", "forecast against observed", forecast_plot(data)),
        ("plot-misses", "misses explained", misses_plot(data)),
        ("plot-top", "busiest items", top_plot(data)),
    ]
    stamp = "%Y-%m-%d %H:%M:%S"
    return page().render(
        d=data, t=totals(data), plots=plots, around=before_after(data), top=top_items(data),
        intents=intent_shares(data),
        csp=CSP, pct=_pct, ms=_ms, since=_when(data.since).strftime(stamp),
        until=_when(data.until).strftime(stamp),
        now=_when(time.time() if now is None else now).strftime(stamp),
    )  # fmt: skip


def write_report(store: Store, engine: str, since: float, until: float, path: Path) -> Path:
    """Write the report of ``engine`` over ``[since, until]`` to ``path``."""
    path.write_text(render(load(store, engine, since, until)), encoding="utf-8")
    return path


# -- command -------------------------------------------------------------------------------
def parse_moment(value: str, now: float) -> float:
    """``24h``/``7d``/``90min`` before ``now``, or an ISO 8601 time (UTC unless it says)."""
    import pandas as pd

    try:
        return now - pd.Timedelta(value).total_seconds()
    except ValueError:
        pass
    try:
        moment = pd.Timestamp(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r} is neither a duration (24h) nor a time") from exc
    return float((moment if moment.tzinfo else moment.tz_localize("UTC")).timestamp())


def _checked(value: str | None) -> str | None:
    if value is not None:
        parse_moment(value, time.time())
    return value


def _engine(store: Store, name: str | None) -> str:
    from tasks.adapters import telemetry

    known = telemetry.engines_with_history(store)
    if name is not None:
        return name
    if len(known) != 1:
        found = ", ".join(known) or "none"
        raise BadInputError(
            f"name one with --engine (engines with history: {found})", where="--engine"
        )
    return known[0]


def report(
    engine: Annotated[str | None, typer.Option(help="Engine (default: the only one).")] = None,
    since: Annotated[
        str, typer.Option(help="Start: a duration back (24h, 7d) or a time.", callback=_checked)
    ] = "24h",
    until: Annotated[
        str | None, typer.Option(help="End (default: now).", callback=_checked)
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out", "-o", help="HTML file (default: prewarm-report-ENGINE.html; or a URL)."
        ),
    ] = None,
) -> None:
    """Write one self-contained HTML page: does warm-up pay on this engine?"""
    from jobs.locations import check_output, local_output

    check_output(out, folder=False)
    from tasks.adapters.store import store_client

    now = time.time()
    start, end = parse_moment(since, now), parse_moment(until, now) if until else now
    if start >= end:
        raise BadInputError("the period is empty (--since is not before --until)", where="--since")
    store = store_client()
    name = _engine(store, engine)
    target = out or f"prewarm-report-{name}.html"
    with local_output(target, folder=False) as path:
        write_report(store, name, start, end, path)
    typer.echo(target)


def register(app: typer.Typer) -> None:
    """Add ``prewarm report``."""
    app.command("report")(report)
