"""Quota configuration as plain values for the hot path: bucket specs and workload classes."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from django.conf import settings

from quotas.core.increments import DEFAULT_STEP_TOKENS, StepPlan
from quotas.core.learned import (
    CEILING,
    CUT,
    REGROW_SECONDS,
    learned_name,
    needs_learned_concurrency,
)
from quotas.core.model import BucketSpec
from quotas.core.specs import bucket_spec_build, with_headroom, with_provider_rules
from quotas.models import Bucket, WorkloadClass
from routing.core.contracts import FallbackContract, contract_parse
from routing.models import Provider

# D1: the order in which a request's buckets are checked, narrowest scope first: the caller's
# side, then the provider's — the API key (credential) it is sent with, that key's project /
# workspace, the organisation's limit on the one model (endpoint: provider × upstream model),
# the organisation (the provider account), and last the gateway's model route.
SCOPE_ORDER = Bucket.SCOPE_FIELDS  # the bucket row's scope fields are listed in this order
TENANT_SIDE = frozenset(SCOPE_ORDER[:5])
# The provider's own limits (B2): counted with headroom and the provider's counting rules.
PROVIDER_SIDE = frozenset({"credential", "project", "endpoint", "provider"})
# What building a row's spec raises when the row cannot be counted: a bad rule, dimension or
# window (ValueError), a non-positive period or capacity, an unknown time zone, a bad scope.
UNBUILDABLE = (ValueError, TypeError, LookupError, AttributeError)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    deadline_seconds: float
    max_queue_depth: int
    overload_action: str  # reject | degrade | defer
    weight: float
    retry_budget: int
    # C10: "max" (the whole maximum output while a stream runs) or "increments" (in steps of
    # ``stream_step_tokens``, quotas.core.increments).
    stream_reservation: str = "max"
    stream_step_tokens: int = DEFAULT_STEP_TOKENS
    # F5: narrows the route's fallback contract (None: the route's alone).
    contract: FallbackContract | None = None

    @property
    def step_plan(self) -> StepPlan | None:
        """How this class's streams reserve their output in steps (None: the whole maximum)."""
        if self.stream_reservation != "increments":
            return None
        return StepPlan(step_tokens=max(1, self.stream_step_tokens))


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
    return bucket_spec_build(
        name=bucket.name,
        scope=f"{bucket.scope_kind}:{scope_id}",
        dimension=bucket.dimension,
        rule=bucket.rule,
        capacity=bucket.capacity,
        period_seconds=bucket.period_seconds,
        duration_seconds=bucket.duration_seconds,
        window=bucket.window,
        resets_at=bucket.resets_at,
        timezone=bucket.timezone,
        factor=bucket.factor,
        shadow=bucket.shadow,
    )


def bucket_provider(bucket: Bucket) -> Provider | None:
    """The provider account whose limit a provider-side bucket is (None for other scopes)."""
    kind = bucket.scope_kind
    if kind == "provider":
        return bucket.provider
    if kind in ("credential", "project", "endpoint"):
        owner = getattr(bucket, kind)
        return owner.provider if owner is not None else None
    return None


def bucket_spec_or_none(bucket: Bucket) -> BucketSpec | None:
    """``bucket_spec``, or None for a row that cannot be counted (logged as an ERROR): one bad
    row must not take every tenant's configuration down with it."""
    try:
        return bucket_spec(bucket)
    except UNBUILDABLE as exc:
        log.error(
            "bucket %r (id %s) is not counted: its configuration is invalid: %s",
            bucket.name,
            bucket.pk,
            exc,
        )
        return None


def learned_buckets(
    providers: Iterable[Provider], configured: Mapping[tuple[str, int], Sequence[BucketSpec]]
) -> list[Bucket]:
    """The learned concurrency limit of each provider account that configures none
    (``quotas.core.learned``), as unsaved rows: the broker counts them, pages show them."""
    if not settings.LEARN_PROVIDER_CONCURRENCY:
        return []
    return [
        Bucket(
            name=learned_name(f"provider:{provider.name}"),
            scope_kind=Bucket.ScopeKind.PROVIDER,
            provider=provider,
            dimension=Bucket.Dimension.CONCURRENCY,
            rule=Bucket.Rule.CONCURRENCY,
            capacity=CEILING,
            period_seconds=REGROW_SECONDS,
            factor=CUT,
            source=Bucket.Source.LEARNED,
        )
        for provider in providers
        if provider.learn_concurrency
        and needs_learned_concurrency(configured.get(("provider", provider.id), ()))
    ]


def with_learned_buckets(buckets: list[Bucket], providers: Iterable[Provider]) -> list[Bucket]:
    """``buckets`` (rows) and the learned limits of those ``providers`` that configure no
    concurrency among them, for pages that show what the broker counts."""
    configured: dict[tuple[str, int], list[BucketSpec]] = {}
    for b in buckets:
        if b.scope_kind == Bucket.ScopeKind.PROVIDER:
            try:
                spec = bucket_spec(b)
            except UNBUILDABLE:  # not counted by the broker either (``quota_snapshot_build``)
                continue
            configured.setdefault(("provider", b.provider_id), []).append(spec)
    return buckets + learned_buckets(providers, configured)


def quota_snapshot_build() -> QuotaSnapshot:
    """Every bucket the broker counts, by scope node, and the workload classes.

    A row that cannot be counted is left out with an ERROR log (``bucket_spec_or_none``).
    """
    grouped: dict[tuple[str, int], list[ScopedBucket]] = defaultdict(list)
    rows = Bucket.objects.select_related(
        "provider", "credential__provider", "project__provider", "endpoint__provider"
    ).order_by("name")
    for bucket in rows:
        spec = bucket_spec_or_none(bucket)
        if spec is None:
            continue
        scope_id = getattr(bucket, f"{bucket.scope_kind}_id")
        provider = bucket_provider(bucket)
        if provider is not None:
            spec = with_provider_rules(spec, provider.protocol)
            spec = with_headroom(spec, settings.PROVIDER_HEADROOM_SECONDS)
        grouped[(bucket.scope_kind, scope_id)].append(
            ScopedBucket(spec=spec, scope_kind=bucket.scope_kind)
        )
    configured = {key: [b.spec for b in value] for key, value in grouped.items()}
    for bucket in learned_buckets(Provider.objects.order_by("name"), configured):
        spec = bucket_spec(bucket)
        grouped[("provider", bucket.provider_id)].append(ScopedBucket(spec, "provider"))
    workloads = {
        w.name: Workload(
            name=w.name,
            deadline_seconds=w.deadline_seconds,
            max_queue_depth=w.max_queue_depth,
            overload_action=w.overload_action,
            weight=w.weight,
            retry_budget=w.retry_budget,
            stream_reservation=w.stream_reservation,
            stream_step_tokens=w.stream_step_tokens,
            contract=contract_parse(w.fallback_contract) if w.fallback_contract else None,
        )
        for w in WorkloadClass.objects.all()
    }
    return QuotaSnapshot(
        workloads=workloads, buckets={key: tuple(value) for key, value in grouped.items()}
    )
