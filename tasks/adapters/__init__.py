"""prewarm's edge: everything that talks to Redis, engines over HTTP, git and ZMQ.

Small classes built once per worker process, with third-party errors translated into
prewarm's error tree here: the engine client (:mod:`.engine_client`), the response cache
(:mod:`.cache_client`), connection checks (:mod:`.connections`), the per-engine semaphore
(:mod:`.engine_semaphore`), the KV-event subscriber (:mod:`.kv_subscriber`), plan and WAL storage
(:mod:`.plan_store`, :mod:`.wal_store`), template repositories in git (:mod:`.template_repos`),
and the one registry of Redis key names (:mod:`.redis_keys`). The services (the loop, planning
inputs, plan execution, recovery) take these as arguments; the Celery tasks call the services.
"""
