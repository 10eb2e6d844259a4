"""A tenant's saturation page (SPEC H2, H3), assembled: live levels, charts, shares, totals.

The view reads the clock once and says whether the reader is platform staff; everything a
tenant member must not see (shared pools, other tenants' traffic) is left out here, not hidden
in the template.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils.safestring import SafeString, mark_safe

from ops.charts import Series, bar_chart, format_value, line_chart
from ops.selectors import (
    LedgerSeries,
    ProviderShare,
    QueueSeries,
    Span,
    Window,
    capacity_share,
    ledger_series,
    queue_series,
    routes_used,
    window_of,
)
from quotas.levels import Levels, bucket_levels
from routing.models import Provider
from tenants.models import Tenant

SERVED, FAILED, OTHER_429 = "#4d9e5b", "#8a8a8a", "#b5a13a"
REFUSAL_COLOURS = ("#d9822b", "#c23934", "#7b61a8", "#3f7fbf")
TOP_REASONS = len(REFUSAL_COLOURS)


@dataclass(frozen=True)
class Chart:
    key: str
    svg: SafeString  # ops.charts escapes every text it writes
    note: str = ""


@dataclass(frozen=True)
class Stat:
    label: str
    value: str
    hint: str = ""


@dataclass(frozen=True)
class SaturationPage:
    window: Window
    levels: Levels
    charts: list[Chart]
    stats: list[Stat]
    refusals: list[tuple[str, int]]  # 429 reason code → requests in the window, most first
    shares: list[ProviderShare] | None  # None: not for this reader


def saturation_page(*, tenant: Tenant, span: Span, now: datetime, staff: bool) -> SaturationPage:
    """Everything the page shows for ``tenant`` over ``span`` ending at ``now``."""
    window = window_of(span, now)
    providers = list(Provider.objects.order_by("name").values_list("name", flat=True))
    ledger = ledger_series(tenant=tenant, window=window, providers=providers)
    queue = queue_series(tenant=tenant, window=window)
    shares: list[ProviderShare] | None = None
    if staff:
        shares = capacity_share(tenant=tenant, window=window)
        used_providers, used_models = routes_used(tenant=tenant, window=window)
        levels = bucket_levels(
            tenant=tenant, shared=True, providers=used_providers, models=used_models
        )
    else:
        levels = bucket_levels(tenant=tenant, shared=False)
    refusals = _refusal_totals(ledger)
    return SaturationPage(
        window=window,
        levels=levels,
        charts=_charts(window, ledger, queue, [reason for reason, _ in refusals]),
        stats=_stats(ledger, queue),
        refusals=refusals,
        shares=shares,
    )


def _refusal_totals(ledger: LedgerSeries) -> list[tuple[str, int]]:
    totals = [(reason, int(sum(v))) for reason, v in ledger.refused_by_reason.items()]
    return sorted(totals, key=lambda item: (-item[1], item[0]))


def _svg(markup: str) -> SafeString:
    # Safe: ops.charts escapes every text it writes into the markup.
    return mark_safe(markup)


def _request_series(ledger: LedgerSeries, reasons: list[str]) -> list[Series]:
    series = [Series("served", ledger.served, SERVED)]
    shown = reasons[:TOP_REASONS] if len(reasons) <= TOP_REASONS else reasons[: TOP_REASONS - 1]
    for reason, colour in zip(shown, REFUSAL_COLOURS, strict=False):
        series.append(Series(f"429 {reason}", ledger.refused_by_reason[reason], colour))
    rest = [ledger.refused_by_reason[r] for r in reasons if r not in shown]
    if rest:
        folded = [sum(column) for column in zip(*rest, strict=True)]
        series.append(Series(f"429 {len(rest)} other reasons", folded, OTHER_429))
    series.append(Series("other errors", ledger.failed, FAILED))
    return series


def _upstream_series(ledger: LedgerSeries) -> list[Series]:
    series = []
    for kind, counts in (("429", ledger.upstream_429), ("503", ledger.upstream_503)):
        for provider, values in counts.items():
            if any(values):
                series.append(Series(f"{provider} {kind}", values))
    return series


def _charts(
    window: Window, ledger: LedgerSeries, queue: QueueSeries, reasons: list[str]
) -> list[Chart]:
    labels, ticks = window.labels(), window.ticks()
    per = "minute" if window.span.step == 60 else f"{window.span.step // 60} min"
    low, high = ("p50", "p95") if queue.percentiles else ("mean", "max")
    charts = [
        Chart(
            "requests",
            _svg(
                bar_chart(
                    title=f"Requests per {per}: served and refused (429 by reason code)",
                    labels=labels,
                    ticks=ticks,
                    series=_request_series(ledger, reasons),
                )
            ),
        ),
        Chart(
            "queue",
            _svg(
                line_chart(
                    title=f"Queue wait per reservation ({low} / {high})",
                    labels=labels,
                    ticks=ticks,
                    series=[Series(low, queue.p50_ms), Series(high, queue.p95_ms, "#c23934")],
                    unit="ms",
                )
            ),
            note="Time a reservation waited for capacity in the broker's fair queue.",
        ),
        Chart(
            "tokens",
            _svg(
                line_chart(
                    title=f"Tokens per {per}: used vs estimated before dispatch",
                    labels=labels,
                    ticks=ticks,
                    series=[
                        Series("used", ledger.tokens, SERVED),
                        Series("estimated", ledger.estimated_tokens, "#d9822b"),
                    ],
                )
            ),
            note="Served requests only; the gap is the estimation error (C11).",
        ),
        Chart(
            "spend",
            _svg(
                bar_chart(
                    title=f"Spend per {per}",
                    labels=labels,
                    ticks=ticks,
                    series=[Series("spend", ledger.spend, "#7b61a8")],
                    unit="USD",
                )
            ),
        ),
        Chart(
            "attempts",
            _svg(
                line_chart(
                    title="Upstream attempts per dispatched request",
                    labels=labels,
                    ticks=ticks,
                    series=[Series("attempts", ledger.attempts)],
                )
            ),
            note="Above 1: retries and fallbacks spent from the request's retry budget (F4).",
        ),
    ]
    upstream = _upstream_series(ledger)
    if upstream:
        charts.append(
            Chart(
                "upstream",
                _svg(
                    bar_chart(
                        title="Requests that met a provider 429 / 503",
                        labels=labels,
                        ticks=ticks,
                        series=upstream,
                    )
                ),
            )
        )
    return charts


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "—"


def _stats(ledger: LedgerSeries, queue: QueueSeries) -> list[Stat]:
    served, refused, failed = sum(ledger.served), sum(ledger.refused), sum(ledger.failed)
    requests = served + refused + failed
    tokens, estimated = sum(ledger.tokens), sum(ledger.estimated_tokens)
    dispatched = sum(ledger.dispatched)
    waits = [w for w in queue.p95_ms if w is not None]
    return [
        Stat("requests", format_value(requests)),
        Stat("served", _percent(served, requests)),
        Stat("refused (429)", _percent(refused, requests), f"{int(refused)} requests"),
        Stat("deadline expiries", format_value(sum(ledger.deadline_expiries))),
        Stat(
            "worst queue wait",
            format_value(max(waits), "ms") if waits else "—",
            "highest p95 of an interval" if queue.percentiles else "highest wait",
        ),
        Stat(
            "estimate vs used",
            f"{100 * (estimated - tokens) / tokens:+.1f} %" if tokens else "—",
            f"{format_value(sum(ledger.over_reserved_tokens))} tokens over-reserved",
        ),
        Stat("spend", f"{sum(ledger.spend):.4f} USD"),
        Stat(
            "attempts per request",
            f"{sum(ledger.attempts_sum) / dispatched:.2f}" if dispatched else "—",
            "of the requests dispatched upstream",
        ),
    ]
