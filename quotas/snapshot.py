"""Quota configuration as plain values for the hot path: bucket specs and workload classes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from quotas.core.model import BucketSpec, Dimension, Rule, Window
from quotas.models import Bucket, WorkloadClass

# D1: the order in which a request's buckets are checked, narrowest scope first.
SCOPE_ORDER = ("api_key", "app", "team", "tenant", "partner", "provider", "model")
TENANT_SIDE = frozenset(SCOPE_ORDER[:5])
# A ramp with no configured floor may always send this many requests per interval, so traffic
# can start from idle; from there it may grow by the configured factor per interval.
RAMP_DEFAULT_FLOOR = 20.0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    deadline_seconds: float
    max_queue_depth: int
    overload_action: str  # reject | degrade | defer
    weight: float
    retry_budget: int


@dataclass(frozen=True, slots=True)
class ScopedBucket:
    spec: BucketSpec
    scope_kind: str

    @property
    def tenant_side(self) -> bool:
        return self.scope_kind in TENANT_SIDE


@dataclass(frozen=True)
class QuotaSnapshot:
    workloads: dict[str, Workload]
    buckets: dict[tuple[str, int], tuple[ScopedBucket, ...]]  # (scope kind, scope id) → buckets

    def for_scopes(self, scopes: list[tuple[str, int | None]]) -> tuple[ScopedBucket, ...]:
        """The buckets of these scope nodes, in the order given (narrowest first)."""
        found: list[ScopedBucket] = []
        for kind, ident in scopes:
            if ident is not None:
                found.extend(self.buckets.get((kind, ident), ()))
        return tuple(found)


def bucket_spec(bucket: Bucket) -> BucketSpec:
    """The core's view of one configured bucket; the scope node is its Redis hash tag."""
    scope_id = getattr(bucket, f"{bucket.scope_kind}_id")
    rule = Rule(bucket.rule)
    if rule is Rule.RAMP:
        dimension = Dimension.REQUESTS
        capacity = bucket.capacity or RAMP_DEFAULT_FLOOR
        period = bucket.period_seconds or 60.0
    elif rule is Rule.ROLLING_WINDOW:
        dimension, capacity, period = (
            Dimension(bucket.dimension),
            bucket.capacity,
            bucket.duration_seconds,
        )
    else:
        dimension, capacity, period = (
            Dimension(bucket.dimension),
            bucket.capacity,
            bucket.period_seconds,
        )
    resets_at = 0.0
    if bucket.resets_at is not None:
        at = bucket.resets_at
        resets_at = at.hour * 3600 + at.minute * 60 + at.second
    return BucketSpec(
        name=bucket.name,
        scope=f"{bucket.scope_kind}:{scope_id}",
        dimension=dimension,
        rule=rule,
        capacity=float(capacity or 0.0),
        period=float(period or 0.0),
        window=Window(bucket.window) if bucket.window else None,
        resets_at=resets_at,
        timezone=bucket.timezone or "UTC",
        factor=float(bucket.factor or 1.0),
        shadow=bucket.shadow,
    )


def quota_snapshot_build() -> QuotaSnapshot:
    grouped: dict[tuple[str, int], list[ScopedBucket]] = defaultdict(list)
    for bucket in Bucket.objects.order_by("name"):
        scope_id = getattr(bucket, f"{bucket.scope_kind}_id")
        grouped[(bucket.scope_kind, scope_id)].append(
            ScopedBucket(spec=bucket_spec(bucket), scope_kind=bucket.scope_kind)
        )
    workloads = {
        w.name: Workload(
            name=w.name,
            deadline_seconds=w.deadline_seconds,
            max_queue_depth=w.max_queue_depth,
            overload_action=w.overload_action,
            weight=w.weight,
            retry_budget=w.retry_budget,
        )
        for w in WorkloadClass.objects.all()
    }
    return QuotaSnapshot(
        workloads=workloads, buckets={key: tuple(value) for key, value in grouped.items()}
    )
