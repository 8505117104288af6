"""Services: the loop, planning, execution, re-warm, KV follow, recovery, training and status.

Plain functions and classes that take adapters (:mod:`tasks.adapters`) and settings; no Celery,
no Redis, HTTP, git or ZMQ call of their own.
"""
