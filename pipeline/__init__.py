"""Pure domain logic of prewarm: records, parsers, windows, plans, cache keys, the WAL.

Nothing in this package opens a socket, reads the environment or imports Celery.
"""
