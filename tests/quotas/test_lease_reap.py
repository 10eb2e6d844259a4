"""C9 reaping: the ledger row of a lease whose gateway died says whose request it was."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal

import redis.asyncio
from django.conf import settings

from quotas.core.model import Usage
from quotas.levels import broker_spec
from quotas.models import Bucket, Reservation
from quotas.services import lease_reap
from quotas.store.redis import RedisReservationStore
from tenants.models import ApiKey
from tests.personas import Personas

BUCKETS = [
    "api_key:acme/search/web/ci:requests:1m",
    "app:acme/search/web:concurrency",
    "tenant:acme:total_tokens:day",
    "tenant:acme:spend:rolling-5h",
    "provider:alpha:requests:1m",
]


def abandon(reservation_id: str, demand: Usage) -> None:
    """Take ``demand`` from ``BUCKETS`` under a lease that ran out a minute ago (its gateway
    died holding it), through the broker's real store."""
    specs = [broker_spec(Bucket.objects.get(name=name)) for name in BUCKETS]

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            store = RedisReservationStore(client, prefix=settings.REDIS_PREFIX)
            await store.bootstrap()
            grant = await store.reserve(
                reservation_id, specs, demand, now=time.time() - 90, lease_seconds=30
            )
            assert not hasattr(grant, "reason"), grant
        finally:
            await client.aclose()

    asyncio.run(run())


def test_it_records_whose_request_an_expired_lease_was(personas: Personas) -> None:
    key = ApiKey.objects.get(name="ci", app__name="web", app__team__tenant__name="acme")
    Bucket.objects.create(
        name=BUCKETS[0],
        scope_kind="api_key",
        api_key=key,
        dimension="requests",
        rule="refill",
        capacity=60,
        period_seconds=60,
    )
    abandon("gen-dead:1", Usage(input_tokens=300, output_tokens=108, spend=0.0025))

    assert lease_reap() == 1

    row = Reservation.objects.get(id="gen-dead:1")
    assert (row.outcome, row.reason_code, row.request_id) == (
        "expired",
        "lease_expired",
        "gen-dead",
    )
    assert (row.tenant_id, row.app_id, row.api_key_id) == (personas.acme.pk, key.app_id, key.pk)
    assert row.provider == "alpha"
    assert row.estimated_total_tokens == 408
    assert row.estimated_spend == Decimal("0.0025")
    assert row.taken["app:acme/search/web:concurrency"] == 1
