"""The test stack's cleanup (``tests.stack``): its Redis keys go, the Celery queue that runs
the ledger flush included, and nobody else's."""

from __future__ import annotations

import os
import shutil

import redis

from tests.stack import Stack

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def test_it_forgets_the_stacks_celery_queue_and_bindings() -> None:
    stack = Stack(database_url="postgres://unused/x", redis_url=REDIS_URL)
    client = redis.Redis.from_url(REDIS_URL)
    queue = f"{stack.name}-celery"
    mine = [
        f"{stack.name}:ledger",
        queue,
        f"{queue}\x06\x163",  # a priority list
        f"_kombu.binding.{queue}",
        f"_kombu.binding_permanent.{queue}",
    ]
    other = f"{stack.name}x-celery"  # another stack's queue, whose name starts like this one's
    try:
        for name in [*mine, other]:
            client.rpush(name, b"x")
        stack._forget_redis()
        assert [name for name in mine if client.exists(name)] == []
        assert client.exists(other)
    finally:
        client.delete(*mine, other)
        client.close()
        shutil.rmtree(stack.workdir, ignore_errors=True)
