"""``prewarm status [--json]``: what the warm-up loop is doing, per engine.

Sources and how far each was read, the last tick and its outcome, the model in use, the last
plan and its results (warmed, verified, failed), the next tick. Exit status 1 when the loop is
unhealthy (a periodic task or an engine's last tick failed) or users may miss: a fleet's router
down, its replicas not found, an engine's last plan with items not verified — one ``problem:``
line each, with since when.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from tasks.settings import current_settings


def _outcome_line(label: str, outcome: dict[str, Any] | None) -> str:
    if outcome is None:
        return f"  {label}: none yet"
    text = f"  {label}: {outcome['reason']} {outcome.get('window') or ''} — {outcome['status']}"
    if outcome.get("plan_id"):
        text += (
            f"; plan {outcome['plan_id']}: {outcome['planned']} items, {outcome['tokens']} tokens, "
            f"warmed {outcome.get('warmed', '?')}, verified {outcome.get('verified', '?')}, "
            f"failed {outcome.get('failed', '?')}"
        )
        if outcome.get("resumed"):
            text += f", resumed {outcome['resumed']}× after a worker died"
        held = outcome.get("holdings")
        if held:
            text += (f"; after the plan: {held['held']} held where their users land, "
                     f"{held['not_held']} not")  # fmt: skip
    if outcome.get("forecast"):
        text += f" ({outcome['forecast']})"
    return text


def _gate_line(row: dict[str, Any]) -> str:
    """One gated replica: its state, and how long it waited (or took to be admitted)."""
    state = row["state"]
    if row.get("waiting_s") is not None:
        took = f"waiting {row['waiting_s']:.1f}s"
    elif row.get("time_to_ready_s") is not None:
        took = f"ready in {row['time_to_ready_s'] * 1000:.0f} ms (prewarm's part " \
               f"{row['prewarm_s'] * 1000:.0f} ms)"  # fmt: skip
    else:
        took = ""
    why = f": {row['why']}" if row.get("why") else ""
    return f"gate {row['fleet']}/{row['engine']}: {state} {took}{why}"


def _print(status: dict[str, Any], console: Console) -> None:
    health = "healthy" if status["healthy"] else "UNHEALTHY"
    console.print(f"loop: {health}, window {status['window_s']}s")
    for task, error in status["failing_tasks"].items():
        console.print(f"  failing: {task}: {error}")
    for problem in status.get("problems", ()):
        console.print(f"  problem: {problem['line']}")
    for fleet in status.get("fleets", ()):
        replicas = ", ".join(r["engine"] for r in fleet["replicas"]) or "none yet"
        console.print(f"fleet {fleet['fleet']}: {fleet['router']} {fleet['router_url']}, policy "
                      f"{fleet['policy']}, road {fleet['road']}; replicas "
                      f"({fleet['replicas_from']}): {replicas}")  # fmt: skip
    for row in status.get("gate", ()):
        console.print(_gate_line(row))
    for engine in status["engines"]:
        of = f", replica of fleet {engine['fleet']}" if engine.get("fleet") else ""
        console.print(f"engine {engine['engine']} ({engine['url']}{of})")
        for source in engine["sources"]:
            read = sum(source.get("offsets", {}).values())
            state = f"{read} bytes read" if "offsets" in source else "not read yet"
            state = f"error: {source['error']}" if source.get("error") else state
            console.print(f"  source {source['kind']} {source['path']}: {state}")
        obs = engine["observations"]
        console.print(f"  observations v{obs['version']}: {obs['windows']} windows, "
                      f"{obs['records']} records")  # fmt: skip
        console.print(f"  model: {engine['model'] or 'none saved (fitted or frequency)'}")
        console.print(_outcome_line("last tick", engine["last_tick"]))
        console.print(_outcome_line("last plan", engine["last_plan"]))
        holds = engine.get("holds") or {}
        if holds.get("items"):
            console.print(f"  holds: {holds['items']} items found held after the plans that "
                          "primed it")  # fmt: skip
        nxt = engine["next_tick_in_s"]
        console.print(f"  next tick: {'not scheduled' if nxt is None else f'in {nxt:.0f}s'}")


def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the warm-up loop per engine: sources, last tick, model, last plan, next tick."""
    from tasks.adapters.connections import check_settings_redis
    from tasks.adapters.store import store_client
    from tasks.services.status import loop_status

    settings = current_settings()
    check_settings_redis(settings)
    report = loop_status(settings, store_client(settings))
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        _print(report, Console(soft_wrap=True, highlight=False))
    if not report["healthy"]:
        raise typer.Exit(1)


def webhook_routes() -> list[Any]:
    """Routes the api mounts (its provider hook): ``GET /status``, the same JSON as
    ``prewarm status --json`` (503 when the loop is unhealthy)."""
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def report() -> dict[str, Any]:
        from tasks.adapters.store import store_client
        from tasks.services.status import loop_status

        settings = current_settings()
        return json.loads(json.dumps(loop_status(settings, store_client(settings)), default=str))

    async def status_route(request: Request) -> JSONResponse:
        body = await run_in_threadpool(report)
        return JSONResponse(body, status_code=200 if body["healthy"] else 503)

    return [Route("/status", status_route, methods=["GET"])]


def register(app: typer.Typer) -> None:
    """Add ``prewarm status``."""
    app.command("status")(status)
