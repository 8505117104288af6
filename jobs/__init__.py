"""Entry points: the ``prewarm`` CLI, beat schedules, the api/webhook service, watchers."""
