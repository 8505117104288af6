"""The Celery side of prewarm, in layers (import-linter's contract in ``pyproject.toml``):

* task modules (``*_tasks.py``: ``health_tasks``, ``ingest_tasks``, ``loop_tasks``,
  ``model_tasks``, ``repo_tasks``, ``trigger_tasks``, ``warm_tasks``) hold only Celery tasks,
  all on :class:`tasks.base.PrewarmTask`, each a few lines that call one service;
* ``base`` (the task policy) and ``celery_app`` (the app, its queues and ``TASK_MODULES``) sit
  beside them: only tasks need them;
* :mod:`tasks.services`: the loop, planning, execution, re-warm, KV follow, recovery, training
  and status, plain functions and classes taking adapters and settings (no Celery);
* :mod:`tasks.adapters`: every Redis, HTTP, git, ZMQ and file call;
* ``settings`` at the bottom: pure configuration that every layer reads.
"""
