"""The Celery side of prewarm: the app, settings, adapters to Redis / HTTP / git, and thin tasks."""
