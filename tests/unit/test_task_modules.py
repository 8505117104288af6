"""Task modules hold the Celery tasks, the worker imports every one of them, and every task
runs under the one retry policy (:class:`tasks.base.PrewarmTask`)."""

from __future__ import annotations

import importlib
import pkgutil

from celery import Task

import tasks
from tasks.base import PrewarmTask
from tasks.celery_app import TASK_MODULES, app


def _modules_with_tasks() -> set[str]:
    found = set()
    for info in pkgutil.walk_packages(tasks.__path__, "tasks."):
        module = importlib.import_module(info.name)
        if any(isinstance(v, Task) for v in vars(module).values()):
            found.add(info.name)
    return found


def test_the_worker_imports_every_module_that_defines_a_task():
    assert _modules_with_tasks() == set(TASK_MODULES)


def test_every_task_is_a_prewarm_task():
    app.loader.import_default_modules()
    ours = {name: task for name, task in app.tasks.items() if name.startswith("prewarm.")}
    assert len(ours) >= 18
    # one "warm now" task, whatever the trigger (replica, cold cache, demo, cli)
    warm_now = [n for n in ours if n.endswith((".warm", ".warm_engine", ".warm_now"))]
    assert warm_now == ["prewarm.loop.warm"]
    assert sorted(n for n, t in ours.items() if not isinstance(t, PrewarmTask)) == []
