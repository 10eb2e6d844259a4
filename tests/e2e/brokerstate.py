"""Reading a running stack's bucket levels straight from its Redis, as the broker sees them."""

import asyncio

import redis
from redis.asyncio import Redis

from quotas.core.keys import lease_index_key
from quotas.core.learned import learned_concurrency, learned_name
from quotas.core.model import BucketSpec
from quotas.levels import broker_spec
from quotas.models import Bucket
from quotas.store.redis import RedisReservationStore
from tests.stack import wait_until

COLUMNS = (
    "name",
    "scope_kind",
    "api_key_id",
    "app_id",
    "team_id",
    "tenant_id",
    "partner_id",
    "credential_id",
    "project_id",
    "endpoint_id",
    "provider_id",
    "model_id",
    "dimension",
    "rule",
    "capacity",
    "period_seconds",
    "window",
    "resets_at",
    "timezone",
    "duration_seconds",
    "factor",
    "source",
    "shadow",
)


def bucket_available(stack, name: str) -> float:
    """As the broker counts it: a provider's refill bucket less its headroom (a full one of
    30 requests a minute has 29.5 with the default 1 s)."""
    columns = ", ".join(f'"{column}"' for column in COLUMNS)
    [row] = stack.sql(f"select {columns} from quotas_bucket where name = %s", name)
    return _available(stack, broker_spec(Bucket(**dict(zip(COLUMNS, row, strict=True)))))


def learned_available(stack, provider: str) -> float:
    """The room in a provider's learned concurrency bucket (not a row: the snapshot adds it)."""
    [(ident,)] = stack.sql("select id from routing_provider where name = %s", provider)
    name = learned_name(f"provider:{provider}")
    return _available(stack, learned_concurrency(f"provider:{ident}", name))


def _available(stack, spec: BucketSpec) -> float:
    async def read() -> float:
        client = Redis.from_url(stack.redis_url)
        try:
            store = RedisReservationStore(client, prefix=stack.name)
            [level] = await store.levels([spec])
            return level.available
        finally:
            await client.aclose()

    return asyncio.run(read())


def allowances_over(stack, timeout: float = 5.0) -> None:
    """Wait until no allowance of the stack's gateway holds capacity: an allowance grants for a
    second at most and a used one takes the next shortly before its end, so the buckets show
    what the requests used, not what an allowance holds, within about two seconds of the last
    request (quotas/allowances.py)."""
    client = redis.Redis.from_url(stack.redis_url)
    try:
        wait_until(
            lambda: (
                not any(
                    b"allowance:" in lease
                    for lease in client.zrange(lease_index_key(stack.name), 0, -1)
                )
            ),
            timeout=timeout,
            what="the gateway's allowances reconciled",
        )
    finally:
        client.close()
