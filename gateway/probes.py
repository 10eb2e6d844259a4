"""Health probes for Kubernetes and load balancers, served before Django (``gateway.asgi``).

- ``/healthz`` (liveness): the process answers; no I/O at all, so a slow Redis or database
  never gets a live process restarted.
- ``/readyz`` (readiness): this process can serve — Redis answers, the broker's Lua scripts are
  in it (a new or restarted Redis has none: they are loaded here, so readiness does not wait for
  the first request to do it), the database answers, and the configuration snapshot is the
  version Redis announces. 503 names each check that failed.

Unauthenticated (they say nothing about tenants), each check bounded by ``PROBE_TIMEOUT`` and
run concurrently, and not counted in the request metrics (they never reach the pipeline).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from redis.exceptions import ConnectionError as RedisConnectionError

from common import redis as sy_redis
from gateway.errors import MethodNotAllowed
from gateway.snapshot import holder
from quotas.broker import broker_get

PATHS = frozenset({"/healthz", "/readyz"})
OK = "ok"


async def probe(scope: dict[str, Any], send: Any) -> None:
    if scope["method"] not in ("GET", "HEAD"):
        error = MethodNotAllowed("Use GET for this endpoint.")
        await _send(send, error.status, error.envelope(), scope, allow=b"GET, HEAD")
        return
    if scope["path"] == "/healthz":
        await _send(send, 200, {"status": OK}, scope)
        return
    checks = await readiness()
    ready = all(result == OK for result in checks.values())
    body = {"status": OK if ready else "unavailable", "checks": checks}
    await _send(send, 200 if ready else 503, body, scope)


async def readiness() -> dict[str, str]:
    """Each check's result: ``ok`` or why not."""
    redis_checks, database = await asyncio.gather(
        _bounded(_redis_checks()), _bounded(_database_check())
    )
    if isinstance(redis_checks, str):  # Redis did not answer: nothing depending on it passes
        redis_checks = {"redis": redis_checks, "scripts": "not checked", "config": "not checked"}
    assert isinstance(database, str)
    return {**redis_checks, "database": database}


async def _bounded(check: Any) -> Any:
    try:
        return await asyncio.wait_for(check, settings.PROBE_TIMEOUT)
    except TimeoutError:
        return f"no answer within {settings.PROBE_TIMEOUT:g} s"
    except Exception as exc:  # whatever failed, the probe answers and says what
        return f"{type(exc).__name__}: {exc}"


async def _redis_checks() -> dict[str, str]:
    client = sy_redis.async_client()
    try:
        raw = await client.get(sy_redis.key("config", "version"))
    except RedisConnectionError:
        # The first command after a Redis restart meets a dead pooled connection: once more.
        raw = await client.get(sy_redis.key("config", "version"))
    version = int(raw or 0)
    await broker_get().store.scripts_load()
    # A snapshot that cannot be built (the database) fails "config", not "redis".
    return {"redis": OK, "scripts": OK, "config": await _bounded(_config_check(version))}


async def _config_check(version: int) -> str:
    snapshot = holder.peek()
    if snapshot is None or snapshot.version != version:
        snapshot = await holder.recheck()
    if snapshot.version != version:  # the rebuild failed; the old snapshot is still served
        return f"snapshot is version {snapshot.version}, the configuration is at {version}"
    return OK


async def _database_check() -> str:
    await sync_to_async(_select_one)()
    return OK


def _select_one() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        connection.close()  # the next probe connects afresh
        raise


async def _send(
    send: Any, status: int, body: dict[str, Any], scope: dict[str, Any], allow: bytes = b""
) -> None:
    payload = orjson.dumps(body)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"cache-control", b"no-store"),
    ]
    if allow:
        headers.append((b"allow", allow))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    head = scope["method"] == "HEAD"
    await send({"type": "http.response.body", "body": b"" if head else payload})
