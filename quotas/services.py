"""Broker services run off the request path (Celery tasks call these)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from redis.asyncio import Redis

from quotas.core.learned import learned_name
from quotas.core.model import ExpiredLease
from quotas.models import Bucket, Reservation
from quotas.store.redis import RedisReservationStore
from routing.models import Provider

# The estimate a bucket of each dimension holds, as the reservation's field for it.
ESTIMATE_FIELDS = {
    Bucket.Dimension.INPUT_TOKENS: "estimated_input_tokens",
    Bucket.Dimension.OUTPUT_TOKENS: "estimated_output_tokens",
    Bucket.Dimension.TOTAL_TOKENS: "estimated_total_tokens",
    Bucket.Dimension.SPEND: "estimated_spend",
}


def lease_reap(*, limit: int = 500) -> int:
    """C9: expire abandoned leases (their concurrency comes back) and record them in the ledger."""
    expired = asyncio.run(_reap(limit))
    owners = bucket_owners({name for lease in expired for name, _ in lease.taken})
    Reservation.objects.bulk_create(
        [_expired_row(lease, owners) for lease in expired], ignore_conflicts=True
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


def bucket_owners(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """What each named bucket tells of a request that drew from it: its tenant, app, key,
    provider or model (the scope's), and which estimate its amount is (its dimension)."""
    names = set(names)
    owners: dict[str, dict[str, Any]] = {}
    rows = Bucket.objects.filter(name__in=names).select_related(
        "api_key__app__team", "app__team", "team", "provider", "model"
    )
    for bucket in rows:
        owner: dict[str, Any] = {"dimension": bucket.dimension}
        if bucket.api_key is not None:
            key = bucket.api_key
            owner |= {"api_key_id": key.pk, "app_id": key.app_id}
            owner["tenant_id"] = key.app.team.tenant_id
        elif bucket.app is not None:
            owner |= {"app_id": bucket.app.pk, "tenant_id": bucket.app.team.tenant_id}
        elif bucket.team is not None:
            owner["tenant_id"] = bucket.team.tenant_id
        elif bucket.tenant_id is not None:
            owner["tenant_id"] = bucket.tenant_id
        elif bucket.provider is not None:
            owner["provider"] = bucket.provider.name
        elif bucket.model is not None:
            owner["model"] = bucket.model.slug
        owners[bucket.name] = owner
    # Learned concurrency limits are no rows: their names say whose they are.
    for provider in Provider.objects.values_list("name", flat=True):
        learned = learned_name(f"provider:{provider}")
        if learned in names:
            owners[learned] = {"provider": provider, "dimension": Bucket.Dimension.CONCURRENCY}
    return owners


def _expired_row(lease: ExpiredLease, owners: dict[str, dict[str, Any]]) -> Reservation:
    # The gateway that held it is gone. The lease record knows its buckets and what each took;
    # the buckets' scopes tell whose request it was, and their amounts what it was estimated at.
    # The workload class is not in Redis, nor the model unless a model-scope bucket was drawn.
    request_id = lease.reservation_id.rsplit(":", 1)[0]
    identity: dict[str, Any] = {}
    estimates: dict[str, float] = {}
    for name, amount in lease.taken:
        owner = owners.get(name, {})
        for field in ("tenant_id", "app_id", "api_key_id", "provider", "model"):
            if field in owner:
                identity.setdefault(field, owner[field])
        estimate = ESTIMATE_FIELDS.get(owner.get("dimension", ""))
        if estimate is not None:
            estimates[estimate] = max(estimates.get(estimate, 0.0), amount)
    if "estimated_total_tokens" not in estimates:
        parts = [estimates.get(f"estimated_{d}_tokens") for d in ("input", "output")]
        if all(part is not None for part in parts):
            estimates["estimated_total_tokens"] = sum(p for p in parts if p is not None)
    return Reservation(
        id=lease.reservation_id,
        request_id=request_id[:40],
        created_at=datetime.fromtimestamp(lease.created_at, tz=UTC),
        expires_at=datetime.fromtimestamp(lease.expires_at, tz=UTC),
        taken=dict(lease.taken),
        outcome=Reservation.Outcome.EXPIRED,
        reason_code="lease_expired",
        **identity,
        **{
            field: Decimal(repr(value)) if field == "estimated_spend" else round(value)
            for field, value in estimates.items()
        },
    )
