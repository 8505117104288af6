"""Helpers for tests that run prewarm's own commands as processes: the installed command,
waiting for a server or a condition, pacing traffic by the loop's windows and waiting for the
loop's own warm-ups. (Ports and worker processes: :mod:`jobs.embedded`.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import redis


def prewarm_script() -> str:
    """The installed ``prewarm`` console script."""
    return shutil.which("prewarm") or str(Path(sys.executable).with_name("prewarm"))


def stop_process(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Terminate ``proc`` and wait for it; killed when it outlives ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_http(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Block until ``url`` answers (any status); fail if ``proc`` dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            assert proc.poll() is None, f"process exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"{url} did not answer in {timeout_s}s"
            time.sleep(0.2)


def wait_for(check: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.5) -> Any:
    """``check()`` once it is truthy; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s")


def paced_windows(windows: int, window_s: float) -> Iterator[int]:
    """Window numbers ``0 .. windows - 1``, one per ``window_s``: the caller sends a window's
    traffic in the loop body, and the next number comes once that window has passed."""
    for window in range(windows):
        started = time.monotonic()
        yield window
        time.sleep(max(0.0, window_s - (time.monotonic() - started)))


def template_traffic(
    ask: Callable[[int, str, bool], object], windows: int, window_s: float, templates: int
) -> Counter[tuple[int, bool]]:
    """A few paced windows of user traffic: templates ``0 .. templates - 3`` over both endpoints
    in every window, the last two once each (one chat, one completions) in the first window.
    ``ask(template, question, chat)`` sends one request. Returns requests per (template, chat)."""
    used: Counter[tuple[int, bool]] = Counter()
    steady = templates - 2
    for window in paced_windows(windows, window_s):
        for n in range(templates):
            if n >= steady and window > 0:
                continue
            for chat in (True, False) if n < steady else (n == steady,):
                ask(n, f"Window {window}: what about order {n}-{window}?", chat)
                used[(n, chat)] += 1
    return used


def wait_loop_warm(
    store: redis.Redis, engine: str, reasons: tuple[str, ...], since: float, until: float
) -> dict | None:
    """The first warm-up the loop ran by itself on ``engine`` after ``since`` (unix seconds),
    for one of ``reasons`` in that order of preference, once its plan is done — the loop's
    outcome with the plan's ``report`` — or None when there is none by ``until``. Read from
    the store only: nothing is asked of prewarm."""
    from tasks.adapters.plan_store import PlanStore
    from tasks.adapters.redis_keys import LOOP_LAST_PLANS

    while time.time() < until:
        for reason in reasons:
            raw = store.hget(LOOP_LAST_PLANS.format(engine=engine), reason)
            outcome = json.loads(raw) if raw else None
            if not (outcome and outcome["started"] > since and outcome.get("plan_id")):
                continue
            report = PlanStore(store).report(outcome["plan_id"])
            if report["done"]:
                return {**outcome, "report": report}
        time.sleep(0.5)
    return None
