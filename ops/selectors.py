"""Reading the ledger for a tenant's saturation page (SPEC H2, H3): per-interval series.

Every selector takes the tenant and a ``Window`` (the clock is read once, in the view). Each
aggregates in the database with one grouped query over the (tenant, created_at) index — never
one query per interval — and returns plain values with one slot per interval of the window.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import (
    Aggregate,
    Avg,
    Count,
    DateTimeField,
    F,
    FloatField,
    Func,
    Max,
    Q,
    Sum,
    Value,
)
from django.db.models.functions import Greatest

from gateway.models import Generation
from quotas.models import Reservation
from tenants.models import Tenant

# Queue refusals at the deadline (quotas.core.fairqueue.QueueReason) — SPEC H2's expiries —
# and the plan's own refusal when every candidate is full past it (routing.core.capacity).
DEADLINE_REASONS = ("deadline", "deadline_unreachable", "capacity_wait")
# What the pipeline notes per failed upstream attempt ("<provider>:<outcome>", gateway.call).
UPSTREAM_429 = ("capacity", "policy")
UPSTREAM_503 = ("overload",)


@dataclass(frozen=True)
class Span:
    key: str
    label: str
    seconds: int
    step: int  # seconds per interval
    tick: int  # seconds between labelled intervals on a chart's x axis


SPANS = {
    "1h": Span("1h", "last hour", 3600, 60, 10 * 60),
    "24h": Span("24h", "last 24 hours", 24 * 3600, 15 * 60, 3 * 3600),
}


@dataclass(frozen=True)
class Window:
    """``span`` seconds ending with the interval that holds ``now``, in ``step`` intervals."""

    span: Span
    start: datetime
    end: datetime

    @property
    def count(self) -> int:
        return self.span.seconds // self.span.step

    def starts(self) -> list[datetime]:
        step = timedelta(seconds=self.span.step)
        return [self.start + step * i for i in range(self.count)]

    def index(self, when: datetime) -> int | None:
        i = int((when - self.start).total_seconds() // self.span.step)
        return i if 0 <= i < self.count else None

    def labels(self) -> list[str]:
        return [t.strftime("%H:%M") for t in self.starts()]

    def ticks(self) -> list[int]:
        """The intervals that start on a round time (every ``span.tick`` seconds, UTC)."""
        return [i for i, t in enumerate(self.starts()) if int(t.timestamp()) % self.span.tick == 0]


def window_of(span: Span, now: datetime) -> Window:
    """The window of ``span`` whose last interval holds ``now`` (intervals aligned to UTC)."""
    end = datetime.fromtimestamp((int(now.timestamp()) // span.step + 1) * span.step, tz=UTC)
    return Window(span=span, start=end - timedelta(seconds=span.seconds), end=end)


class TimeBin(Func):
    """The start of the ``step``-second interval (counted from ``origin``) holding a time."""

    function = "date_bin"  # PostgreSQL 14+: date_bin(stride, source, origin)
    output_field = DateTimeField()

    def __init__(self, expression: Any, *, step: int, origin: datetime) -> None:
        self.step = int(step)
        super().__init__(Value(timedelta(seconds=step)), expression, Value(origin))

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # The embedded default database has no date_bin: whole steps since the Unix epoch,
        # the same intervals since ``window_of`` aligns the origin to a multiple of the step.
        sql, params = compiler.compile(self.source_expressions[1])
        return (
            f"datetime((CAST(strftime('%%s', {sql}) AS INTEGER) / {self.step}) * {self.step}, "
            "'unixepoch')",
            params,
        )


class Percentile(Aggregate):
    """PostgreSQL's ``percentile_cont(fraction) WITHIN GROUP (ORDER BY expression)``."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, *, fraction: float, **extra: Any) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("a percentile is a fraction between 0 and 1")
        super().__init__(expression, fraction=repr(float(fraction)), **extra)


def _in_window(window: Window) -> Q:
    return Q(created_at__gte=window.start, created_at__lt=window.end)


def _zeros(window: Window) -> list[float]:
    return [0.0] * window.count


@dataclass
class LedgerSeries:
    """What the tenant's requests did, one value per interval (SPEC H2)."""

    served: list[float]
    failed: list[float]  # errors other than 429 (upstream failures, invalid requests)
    refused_by_reason: dict[str, list[float]]  # 429s by reason code
    deadline_expiries: list[float]
    tokens: list[float]  # input + output tokens of served requests
    estimated_tokens: list[float]  # what the broker estimated for the same requests (C11)
    over_reserved_tokens: list[float]  # estimate above actual: capacity held for nothing
    spend: list[float]  # USD
    attempts_sum: list[float]  # upstream attempts of the requests that were dispatched (F4)
    dispatched: list[float]  # requests that reached a provider at least once
    upstream_429: dict[str, list[float]] = field(default_factory=dict)  # per provider
    upstream_503: dict[str, list[float]] = field(default_factory=dict)

    @property
    def refused(self) -> list[float]:
        totals = [0.0] * len(self.served)
        for values in self.refused_by_reason.values():
            totals = [t + v for t, v in zip(totals, values, strict=True)]
        return totals

    @property
    def attempts(self) -> list[float | None]:
        """Upstream attempts per dispatched request, per interval (None: nothing dispatched)."""
        return [
            a / d if d else None for a, d in zip(self.attempts_sum, self.dispatched, strict=True)
        ]


def _explained(provider: str, outcomes: tuple[str, ...]) -> Q:
    # One JSON containment test per outcome; answered by the row itself, no join.
    q = Q()
    for outcome in outcomes:
        q |= Q(detail__explanation__contains=[f"{provider}:{outcome}"])
    return q


def ledger_series(*, tenant: Tenant, window: Window, providers: list[str]) -> LedgerSeries:
    """The tenant's requests per interval, 429s split by reason code; one grouped query.

    Upstream 429 / 503 are counted per provider in ``providers`` as requests that met at least
    one such answer from it (PostgreSQL only: JSON containment).
    """
    served_q = Q(status__lt=400)
    aggregates: dict[str, Any] = {
        "requests": Count("pk"),
        "served": Count("pk", filter=served_q),
        "deadline": Count("pk", filter=Q(reason_code__in=DEADLINE_REASONS)),
        "tokens": Sum(F("input_tokens") + F("output_tokens"), filter=served_q),
        "estimated": Sum(
            F("estimated_input_tokens") + F("estimated_output_tokens"), filter=served_q
        ),
        "over": Sum(
            Greatest(
                F("estimated_input_tokens")
                + F("estimated_output_tokens")
                - F("input_tokens")
                - F("output_tokens"),
                Value(0),
            ),
            filter=served_q,
        ),
        "spend": Sum("cost"),
        "attempt_total": Sum("attempts", filter=Q(attempts__gte=1)),
        "dispatched": Count("pk", filter=Q(attempts__gte=1)),
    }
    upstream = connection.features.supports_json_field_contains
    for n, provider in enumerate(providers if upstream else []):
        aggregates[f"u429_{n}"] = Count("pk", filter=_explained(provider, UPSTREAM_429))
        aggregates[f"u503_{n}"] = Count("pk", filter=_explained(provider, UPSTREAM_503))
    rows = (
        Generation.objects.filter(_in_window(window), tenant_id=tenant.pk)
        .annotate(bin=TimeBin("created_at", step=window.span.step, origin=window.start))
        .values("bin", "status", "reason_code")
        .annotate(**aggregates)
        .order_by()
    )
    out = LedgerSeries(
        served=_zeros(window),
        failed=_zeros(window),
        refused_by_reason=defaultdict(lambda: _zeros(window)),
        deadline_expiries=_zeros(window),
        tokens=_zeros(window),
        estimated_tokens=_zeros(window),
        over_reserved_tokens=_zeros(window),
        spend=_zeros(window),
        attempts_sum=_zeros(window),
        dispatched=_zeros(window),
        upstream_429={p: _zeros(window) for p in providers} if upstream else {},
        upstream_503={p: _zeros(window) for p in providers} if upstream else {},
    )
    for row in rows:
        i = window.index(row["bin"])
        if i is None:
            continue
        out.served[i] += row["served"]
        if row["status"] == 429:
            out.refused_by_reason[row["reason_code"] or "unknown"][i] += row["requests"]
        elif row["status"] >= 400:
            out.failed[i] += row["requests"]
        out.deadline_expiries[i] += row["deadline"]
        out.tokens[i] += row["tokens"] or 0
        out.estimated_tokens[i] += row["estimated"] or 0
        out.over_reserved_tokens[i] += row["over"] or 0
        out.spend[i] += float(row["spend"] or 0)
        out.attempts_sum[i] += row["attempt_total"] or 0
        out.dispatched[i] += row["dispatched"]
        for j, provider in enumerate(providers if upstream else []):
            out.upstream_429[provider][i] += row[f"u429_{j}"]
            out.upstream_503[provider][i] += row[f"u503_{j}"]
    out.refused_by_reason = dict(out.refused_by_reason)
    return out


@dataclass
class QueueSeries:
    """Time spent waiting for capacity per reservation (C8's ``queue_wait_ms``), per interval."""

    p50_ms: list[float | None]
    p95_ms: list[float | None]
    queued: list[float]  # reservations that waited at all
    percentiles: bool  # False: p50/p95 are the mean and the maximum (no percentile support)


def queue_series(*, tenant: Tenant, window: Window) -> QueueSeries:
    """Queue wait p50 / p95 per interval from the reservation ledger; one grouped query."""
    percentiles = connection.vendor == "postgresql"
    low: Aggregate = (
        Percentile("queue_wait_ms", fraction=0.5) if percentiles else Avg("queue_wait_ms")
    )
    high: Aggregate = (
        Percentile("queue_wait_ms", fraction=0.95) if percentiles else Max("queue_wait_ms")
    )
    rows = (
        Reservation.objects.filter(_in_window(window), tenant_id=tenant.pk)
        .annotate(bin=TimeBin("created_at", step=window.span.step, origin=window.start))
        .values("bin")
        .annotate(low=low, high=high, queued=Count("pk", filter=Q(queue_wait_ms__gt=0)))
        .order_by()
    )
    out = QueueSeries(
        p50_ms=[None] * window.count,
        p95_ms=[None] * window.count,
        queued=_zeros(window),
        percentiles=percentiles,
    )
    for row in rows:
        i = window.index(row["bin"])
        if i is not None:
            out.p50_ms[i], out.p95_ms[i] = row["low"], row["high"]
            out.queued[i] = row["queued"]
    return out


@dataclass(frozen=True)
class TenantShare:
    name: str  # a tenant's name; only platform staff are given other tenants' shares
    tokens: int
    requests: int
    fraction: float  # of the provider's tokens in the window

    @property
    def percent(self) -> float:
        return round(100 * self.fraction, 1)


@dataclass(frozen=True)
class ProviderShare:
    """One provider's traffic in the window: this tenant's share and the other tenants'."""

    provider: str
    total_tokens: int
    total_requests: int
    tenant: TenantShare
    others: list[TenantShare]  # largest first


def capacity_share(*, tenant: Tenant, window: Window, top: int = 3) -> list[ProviderShare]:
    """For platform staff: each provider the tenant used, and who else used it (SPEC H2).

    Reads every tenant's rows: never call it for a tenant member's page (A4).
    """
    rows = (
        Generation.objects.filter(_in_window(window), status__lt=400)
        .exclude(provider="")
        .values("provider", "tenant_id")
        .annotate(tokens=Sum(F("input_tokens") + F("output_tokens")), requests=Count("pk"))
        .order_by()
    )
    by_provider: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_provider[row["provider"]].append(row)
    used = {p: r for p, r in by_provider.items() if any(x["tenant_id"] == tenant.pk for x in r)}
    others = {x["tenant_id"] for r in used.values() for x in r} - {tenant.pk}
    names = dict(Tenant.objects.filter(pk__in=others).values_list("pk", "name"))
    shares = []
    for provider, provider_rows in sorted(used.items()):
        total_tokens = sum(int(x["tokens"] or 0) for x in provider_rows)
        total_requests = sum(int(x["requests"]) for x in provider_rows)

        def share(row: dict[str, Any], name: str, total: int = total_tokens) -> TenantShare:
            tokens = int(row["tokens"] or 0)
            return TenantShare(name, tokens, int(row["requests"]), tokens / total if total else 0)

        mine = next(x for x in provider_rows if x["tenant_id"] == tenant.pk)
        rest = sorted(
            (
                share(x, names.get(x["tenant_id"], f"#{x['tenant_id']}"))
                for x in provider_rows
                if x["tenant_id"] != tenant.pk
            ),
            key=lambda s: (-s.tokens, s.name),
        )
        if len(rest) > top:
            tail = rest[top:]
            folded = {
                "tokens": sum(s.tokens for s in tail),
                "requests": sum(s.requests for s in tail),
            }
            rest = [*rest[:top], share(folded, f"{len(tail)} other tenants")]
        shares.append(
            ProviderShare(provider, total_tokens, total_requests, share(mine, tenant.name), rest)
        )
    return shares


def routes_used(*, tenant: Tenant, window: Window) -> tuple[list[str], list[str]]:
    """The providers and models that served the tenant in the window (sorted names)."""
    rows = (
        Generation.objects.filter(_in_window(window), tenant_id=tenant.pk)
        .values_list("provider", "model")
        .distinct()
        .order_by()
    )
    providers, models = set(), set()
    for provider, model in rows:
        if provider:
            providers.add(provider)
        if model:
            models.add(model)
    return sorted(providers), sorted(models)
