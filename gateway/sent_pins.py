"""Where a deferred job's request went: the provider that holds its Idempotency-Key (E5).

A job's run sends its id as ``Idempotency-Key`` (``gateway/dispatch.py``); a provider that keeps
keys answers a repeat from the first call. That only helps if the repeat goes to the same
provider: a run that dies after sending leaves nothing but this pin, written to Redis before the
request goes out, and the next run of the job tries that endpoint first (``pipeline._plan``).
"""

from __future__ import annotations

from common import redis as sy_redis
from routing.catalogue import EndpointEntry

# Longer than any job lives (the batch class's window is a day): a pin is read only by re-runs.
PIN_SECONDS = 2 * 86400


async def sent_pin(job_id: str, endpoint_key: str) -> None:
    key = sy_redis.key("jobs", "sent", job_id)
    await sy_redis.async_client().set(key, endpoint_key, ex=PIN_SECONDS)


async def sent_pinned(job_id: str) -> str:
    """The endpoint an earlier run of the job sent to, or ""."""
    raw = await sy_redis.async_client().get(sy_redis.key("jobs", "sent", job_id))
    return raw.decode() if isinstance(raw, bytes) else (raw or "")


def pinned_first(candidates: list[EndpointEntry], pinned: str) -> list[EndpointEntry]:
    """The router's candidates with the pinned endpoint, if among them, tried first."""
    first = [e for e in candidates if e.key == pinned]
    return first + [e for e in candidates if e.key != pinned]
