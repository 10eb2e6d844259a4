"""Live bucket levels for a tenant's saturation page (SPEC B1, H2, H3), read from the broker.

The levels come from the same Redis store the broker reserves in, with one ``levels`` script
call for all of the page's buckets. Which buckets a reader may see is decided here:

- the tenant's own hierarchy (its API keys, apps, teams and the tenant itself): everyone who
  may see the tenant;
- shared pools — the tenant's partner, the providers and model routes that served it — hold
  other tenants' usage too (A4, E4), so only platform staff get them (``shared=True``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db.models import Q
from redis.exceptions import RedisError

from common.durations import duration_format
from quotas.core.model import BucketLevel, BucketSpec
from quotas.models import Bucket
from quotas.snapshot import (
    PROVIDER_SIDE,
    SCOPE_ORDER,
    UNBUILDABLE,
    bucket_spec,
    with_headroom,
    with_learned_buckets,
)
from quotas.store.redis import RedisReservationStore
from routing.models import Provider
from tenants.models import Tenant

# A page that cannot reach Redis says so instead of hanging on it.
REDIS_TIMEOUT_SECONDS = 2.0
WARN_FRACTION = 0.8
# Pools that several tenants draw from: their levels reveal other tenants' usage.
SHARED_SCOPES = frozenset({"partner", "credential", "project", "endpoint", "provider", "model"})
DIMENSION_WORDS = {"spend": "spend (USD)", "concurrency": "concurrent requests"}


def amount_text(value: float, dimension: str) -> str:
    """A bucket amount in its dimension's units: "1,180", "393,333", "37.50 USD", "2.5"."""
    if dimension == Bucket.Dimension.SPEND:
        return f"{value:,.2f} USD"
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def duration_text(seconds: float) -> str:
    """A wait as people read it: "< 1 s", "45 s", "12 min", "3 h 05 min", "2 d 3 h"."""
    if seconds < 1:
        return "< 1 s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@dataclass(frozen=True)
class LevelRow:
    """One bucket as the page shows it: what it limits, how full it is, when it is full again."""

    name: str
    scope: str  # the scope kind's label: "API key", "app", "tenant", "provider account", …
    dimension: str  # Bucket.Dimension value
    rule: str
    capacity: float
    available: float
    used_fraction: float | None  # None for a ramp: its capacity is a floor, not a ceiling
    full_in: float | None  # seconds until the bucket is full again; None: full now, or never
    paused_for: float | None  # seconds the scope stays paused (provider 429, F2)
    shadow: bool  # counted, refuses nothing
    shared: bool  # a pool shared with other tenants (staff only)

    @property
    def used_percent(self) -> float:
        """0–100 for a bar's width (a bucket in debt shows as full)."""
        if self.used_fraction is None:
            return 0.0
        return round(min(100.0, max(0.0, self.used_fraction * 100)), 1)

    @property
    def dimension_text(self) -> str:
        return DIMENSION_WORDS.get(self.dimension, self.dimension.replace("_", " "))

    @property
    def capacity_text(self) -> str:
        return amount_text(self.capacity, self.dimension)

    @property
    def available_text(self) -> str:
        return amount_text(self.available, self.dimension)

    @property
    def full_in_text(self) -> str:
        return duration_text(self.full_in) if self.full_in is not None else ""

    @property
    def paused_text(self) -> str:
        return duration_text(self.paused_for) if self.paused_for is not None else ""

    @property
    def state(self) -> str:
        """``ok``, ``warn`` (≥ 80 % used) or ``full`` — a CSS class of the bar."""
        if self.used_fraction is None:
            return "ok"
        if self.available <= 0 or self.paused_for:
            return "full"
        return "warn" if self.used_fraction >= WARN_FRACTION else "ok"


@dataclass(frozen=True)
class Levels:
    rows: list[LevelRow]
    error: str = ""  # why the live levels could not be read, or which buckets are not counted


def level_buckets(
    *, tenant: Tenant, shared: bool, providers: Sequence[str] = (), models: Sequence[str] = ()
) -> list[Bucket]:
    """The buckets the page shows, narrowest scope first (D1); shared pools only if ``shared``."""
    scope = (
        Q(tenant=tenant)
        | Q(team__tenant=tenant)
        | Q(app__team__tenant=tenant)
        | Q(api_key__app__team__tenant=tenant)
    )
    if shared:
        if tenant.partner_id is not None:
            scope |= Q(partner_id=tenant.partner_id)
        names = list(providers)
        scope |= (
            Q(provider__name__in=names)
            | Q(credential__provider__name__in=names)
            | Q(project__provider__name__in=names)
            | Q(endpoint__provider__name__in=names)
            | Q(model__slug__in=list(models))
        )
    buckets = list(Bucket.objects.filter(scope).order_by("name"))
    if shared:  # the providers' learned concurrency limits: not rows, the broker adds them
        accounts = Provider.objects.filter(name__in=list(providers)).order_by("name")
        buckets = with_learned_buckets(buckets, accounts)
    return sorted(buckets, key=lambda b: SCOPE_ORDER.index(b.scope_kind))


def broker_spec(bucket: Bucket) -> BucketSpec:
    """The bucket as the broker counts it (provider refill buckets keep their headroom)."""
    spec = bucket_spec(bucket)
    if bucket.scope_kind in PROVIDER_SIDE:
        spec = with_headroom(spec, settings.PROVIDER_HEADROOM_SECONDS)
    return spec


def store_levels(specs: Sequence[BucketSpec]) -> tuple[list[BucketLevel], float]:
    """Each bucket's live level and the store's clock, from Redis in one script call.

    For sync callers (views, tasks): a short-lived client, so no connection outlives the page.
    """
    return async_to_sync(_store_levels)(list(specs))


async def _store_levels(specs: list[BucketSpec]) -> tuple[list[BucketLevel], float]:
    client = redis.asyncio.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=REDIS_TIMEOUT_SECONDS,
        socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
    )
    try:
        store = RedisReservationStore(
            client,
            prefix=settings.REDIS_PREFIX,
            lease_seconds=settings.RESERVATION_LEASE_SECONDS,
        )
        levels = await store.levels(specs)
        return levels, store.local_now()
    finally:
        await client.aclose()


def rule_text(bucket: Bucket) -> str:
    """The bucket's rule in a few words: "refill per 1m", "window: day from 00:00 UTC"…"""
    rule = bucket.rule
    if bucket.source == Bucket.Source.LEARNED:
        return "learned from the provider's 429s"
    if rule == Bucket.Rule.REFILL and bucket.period_seconds:
        return f"refills over {duration_format(bucket.period_seconds)}"
    if rule == Bucket.Rule.FIXED_WINDOW:
        at = bucket.resets_at.strftime("%H:%M") if bucket.resets_at else "00:00"
        return f"{bucket.window or 'fixed'} window from {at} {bucket.timezone or 'UTC'}"
    if rule == Bucket.Rule.ROLLING_WINDOW and bucket.duration_seconds:
        return f"rolling {duration_format(bucket.duration_seconds)}"
    if rule == Bucket.Rule.RAMP and bucket.period_seconds:
        return f"ramp ×{bucket.factor:g} per {duration_format(bucket.period_seconds)}"
    return str(Bucket.Rule(rule).label)


def level_row(bucket: Bucket, level: BucketLevel, now: float) -> LevelRow:
    """How full one bucket is at the store's time ``now``."""
    ramp = bucket.rule == Bucket.Rule.RAMP
    used = None if ramp else 1.0 - level.available / level.capacity
    full_in = level.full_at - now
    return LevelRow(
        name=bucket.name,
        scope=str(Bucket.ScopeKind(bucket.scope_kind).label),
        dimension=bucket.dimension,
        rule=rule_text(bucket),
        capacity=level.capacity,
        available=level.available,
        used_fraction=used,
        full_in=full_in if math.isfinite(full_in) and full_in > 0 else None,
        paused_for=level.paused_until - now if level.paused_until > now else None,
        shadow=bucket.shadow,
        shared=bucket.scope_kind in SHARED_SCOPES,
    )


def bucket_levels(
    *, tenant: Tenant, shared: bool, providers: Sequence[str] = (), models: Sequence[str] = ()
) -> Levels:
    """The live level of every bucket the reader may see for ``tenant`` (see the module doc)."""
    counted: list[tuple[Bucket, BucketSpec]] = []
    invalid: list[str] = []
    for bucket in level_buckets(tenant=tenant, shared=shared, providers=providers, models=models):
        try:
            counted.append((bucket, broker_spec(bucket)))
        except UNBUILDABLE as exc:  # the broker leaves it out too (quota_snapshot_build)
            invalid.append(f"'{bucket.name}' ({exc})")
    note = ""
    if invalid:
        note = "Not counted, its configuration is invalid: " + "; ".join(invalid) + "."
    if not counted:
        return Levels(rows=[], error=note)
    try:
        levels, now = store_levels([spec for _, spec in counted])
    except (RedisError, OSError) as exc:
        error = f"Live levels are unavailable: {type(exc).__name__}."
        return Levels(rows=[], error=f"{error} {note}".strip())
    rows = [level_row(b, lv, now) for (b, _), lv in zip(counted, levels, strict=True)]
    return Levels(rows=rows, error=note)


def bucket_level_text(bucket: Bucket) -> str:
    """One bucket's live level in a sentence, for its admin page; when Redis cannot be read,
    that is what the sentence says (the page still renders)."""
    try:
        spec = broker_spec(bucket)
    except UNBUILDABLE as exc:
        return f"Not counted by the broker: its configuration is invalid ({exc})."
    try:
        [level], now = store_levels([spec])
    except (RedisError, OSError) as exc:
        return f"Live level unavailable: Redis did not answer ({type(exc).__name__})."
    row = level_row(bucket, level, now)
    text = f"{row.available_text} of {row.capacity_text} {row.dimension_text} available"
    if row.used_fraction is not None:
        text += f" ({row.used_percent:g} % used)"
    if row.paused_text:
        text += f"; paused for {row.paused_text}"
    if row.full_in_text:
        text += f"; full again in {row.full_in_text}"
    return text + "."
