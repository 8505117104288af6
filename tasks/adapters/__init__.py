"""prewarm's edge: everything that talks to Redis, engines over HTTP, git and ZMQ.

Small classes built once per worker process, with third-party errors translated into
prewarm's error tree here: the engine client (:mod:`.engine_client`), the gateway client
(:mod:`.gateway_client`), connection checks (:mod:`.connections`), the per-engine semaphore
(:mod:`.engine_semaphore`), the KV-event subscriber (:mod:`.kv_subscriber`), plan and WAL storage
(:mod:`.plan_store`, :mod:`.wal_store`), template repositories in git (:mod:`.template_repos`),
the one store client per process (:mod:`.store`), trigger cooldowns (:mod:`.cooldowns`), the
loop's claims and Lua scripts (:mod:`.loop_state`), replica and detector state
(:mod:`.replica_state`), engine probes and token counts (:mod:`.engine_probe`,
:mod:`.engine_tokens`), the template serving store (:mod:`.template_serving`), the telemetry
writer (:mod:`.telemetry`), observation and source files (:mod:`.observations`, :mod:`.sources`,
:mod:`.kv_state`), the warm-up targets (:mod:`.targets`), periodic-task health
(:mod:`.task_health`), the broker's queue lists and lengths (:mod:`.broker_queues`) and the one
registry of Redis key names (:mod:`.redis_keys`). The services
take these as arguments; the Celery tasks call the services.
"""
