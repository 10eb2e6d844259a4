"""E3: a request with an ``Idempotency-Key`` reaches a provider once, however often it is sent.

The first request claims the key in Redis (per tenant, for ``IDEMPOTENCY_TTL_SECONDS``); a
repeat meets 409 naming the first. A request refused before any provider saw it gives the key
back, so the corrected or later retry is served.
"""

from __future__ import annotations

import hashlib
from contextlib import suppress
from pathlib import Path

from django.conf import settings
from redis.exceptions import RedisError

from gateway import redis as sy_redis
from gateway.call import Call
from gateway.errors import IdempotencyConflict

_RELEASE_LUA = (Path(__file__).parent / "lua" / "idempotency_release.lua").read_text()


async def claim(call: Call) -> None:
    """Claim the call's key, or raise IdempotencyConflict naming the request that holds it."""
    key = _key(call)
    client = sy_redis.async_client()
    if not await client.set(key, call.id, nx=True, ex=settings.IDEMPOTENCY_TTL_SECONDS):
        first = (await client.get(key) or b"").decode()
        raise IdempotencyConflict(
            f"A request with this Idempotency-Key was already accepted as {first}; "
            "it is not sent again (its result: GET /v1/generation?id=…)."
        )


async def release(call: Call) -> None:
    """A request refused before it reached any provider gives its Idempotency-Key back, so the
    corrected or later retry is served instead of meeting 409 (the claim stays otherwise)."""
    if not call.idempotency_key or call.attempts:
        return
    key = _key(call)
    with suppress(RedisError):  # a claim that cannot be given back now expires with its TTL
        await sy_redis.async_client().eval(_RELEASE_LUA, 1, key, call.id)


def _key(call: Call) -> str:
    assert call.principal is not None
    digest = hashlib.sha256(call.idempotency_key.encode()).hexdigest()[:32]
    return sy_redis.key("idempotency", call.principal.tenant_id, digest)
