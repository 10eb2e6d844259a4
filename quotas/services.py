"""Broker services run off the request path (Celery tasks call these)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from django.conf import settings
from redis.asyncio import Redis

from quotas.core.model import ExpiredLease
from quotas.models import Reservation
from quotas.store.redis import RedisReservationStore


def lease_reap(*, limit: int = 500) -> int:
    """C9: expire abandoned leases (their concurrency comes back) and record them in the ledger."""
    expired = asyncio.run(_reap(limit))
    Reservation.objects.bulk_create(
        [_expired_row(lease) for lease in expired], ignore_conflicts=True
    )
    return len(expired)


async def _reap(limit: int) -> list[ExpiredLease]:
    client = Redis.from_url(settings.REDIS_URL)
    try:
        store = RedisReservationStore(
            client, prefix=settings.REDIS_PREFIX, lease_seconds=settings.RESERVATION_LEASE_SECONDS
        )
        return await store.reap(limit=limit)
    finally:
        await client.aclose()


def _expired_row(lease: ExpiredLease) -> Reservation:
    # The gateway that held it is gone, so only what the lease record knew is known.
    request_id = lease.reservation_id.rsplit(":", 1)[0]
    return Reservation(
        id=lease.reservation_id,
        request_id=request_id[:40],
        created_at=datetime.fromtimestamp(lease.created_at, tz=UTC),
        expires_at=datetime.fromtimestamp(lease.expires_at, tz=UTC),
        taken=dict(lease.taken),
        outcome=Reservation.Outcome.EXPIRED,
        reason_code="lease_expired",
    )
