"""How the Celery broker keeps a queue's waiting messages in Redis, and how many wait.

With priorities on the Redis transport, a queue's messages wait in one list per priority step:
``<queue>`` for the first step, ``<queue>:N`` for step ``N`` (the transport's ``priority_steps``
and ``sep``, set from :data:`PRIORITY_STEPS` and :data:`PRIORITY_SEP`). A queue's length is
the sum over its lists."""

from __future__ import annotations

from collections.abc import Iterable

from tasks.adapters.store import Store

#: The broker's priority steps (Redis: the lowest number is taken first).
PRIORITY_STEPS = [0, 3, 6, 9]
#: a queue's messages of priority N > 0 wait in the Redis list ``<queue>:N``
PRIORITY_SEP = ":"


def queue_keys(queue: str) -> list[str]:
    """The Redis lists that hold ``queue``'s waiting messages, one per priority step: what its
    length is summed over."""
    return [queue, *(f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS[1:])]


def waiting_messages(broker: Store, queues: Iterable[str]) -> dict[str, int]:
    """Messages waiting in each of ``queues`` (summed over its priority lists), in one round
    trip."""
    keys = {queue: queue_keys(queue) for queue in queues}
    with broker.pipeline(transaction=False) as pipe:
        for lists in keys.values():
            for key in lists:
                pipe.llen(key)
        lengths = iter(pipe.execute())
    return {queue: sum(int(next(lengths)) for _ in lists) for queue, lists in keys.items()}
