"""Redis connections and key names shared by the whole deployment.

Sync clients serve management commands, the admin and Celery tasks; the proxy uses the async
client of its own event loop.
"""

from __future__ import annotations

import functools

import redis
import redis.asyncio
from django.conf import settings


def key(*parts: object) -> str:
    """A deployment-prefixed Redis key: ``key("config", "version")`` → ``sy:config:version``."""
    return ":".join([settings.REDIS_PREFIX, *map(str, parts)])


@functools.cache
def sync_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=False)


def async_client() -> redis.asyncio.Redis:
    # One pool per process: uvicorn runs one event loop per worker process. A blocking pool
    # makes a burst beyond REDIS_MAX_CONNECTIONS wait for a free connection instead of failing.
    global _async_client
    if _async_client is None:
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            settings.REDIS_URL,
            max_connections=settings.REDIS_MAX_CONNECTIONS,
            timeout=settings.REDIS_POOL_TIMEOUT,
        )
        _async_client = redis.asyncio.Redis(connection_pool=pool)
    return _async_client


_async_client: redis.asyncio.Redis | None = None


def config_version_bump() -> int:
    """Tell every gateway process to reload its configuration snapshot."""
    return int(sync_client().incr(key("config", "version")))
