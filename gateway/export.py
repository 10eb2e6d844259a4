"""Ledger rows as CSV (SPEC H3): what the activity page and the generation list show, with the
caller's names, for a spreadsheet. Streamed, so a long time range does not sit in memory."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse

from gateway.models import Generation
from tenants.models import ApiKey, App, Team, Tenant

COLUMNS = [
    "created_at",
    "id",
    "tenant",
    "team",
    "app",
    "key_prefix",
    "workload_class",
    "model",
    "provider",
    "status",
    "reason_code",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost_usd",
    "latency_ms",
    "ttft_ms",
    "attempts",
    "queue_wait_ms",
]
BATCH = 2000


@dataclass(frozen=True)
class CallerNames:
    """Names of the ids a ledger row keeps (rows outlive renames: an id may have none)."""

    tenants: dict[int, str]
    teams: dict[int, str]
    apps: dict[int, str]
    key_prefixes: dict[int, str]

    @classmethod
    def of(cls, rows: Iterable[Generation]) -> CallerNames:
        rows = list(rows)

        def ids(attr: str) -> set[int]:
            return {getattr(r, attr) for r in rows if getattr(r, attr) is not None}

        return cls(
            tenants=dict(Tenant.objects.filter(pk__in=ids("tenant_id")).values_list("pk", "name")),
            teams=dict(Team.objects.filter(pk__in=ids("team_id")).values_list("pk", "name")),
            apps=dict(App.objects.filter(pk__in=ids("app_id")).values_list("pk", "name")),
            key_prefixes=dict(
                ApiKey.objects.filter(pk__in=ids("api_key_id")).values_list("pk", "prefix")
            ),
        )


def _line(row: Generation, names: CallerNames) -> list[Any]:
    detail = row.detail if isinstance(row.detail, dict) else {}
    return [
        row.created_at.isoformat(),
        row.id,
        names.tenants.get(row.tenant_id, f"#{row.tenant_id}"),
        names.teams.get(row.team_id, "") if row.team_id is not None else "",
        names.apps.get(row.app_id, "") if row.app_id is not None else "",
        names.key_prefixes.get(row.api_key_id, "") if row.api_key_id is not None else "",
        row.workload_class,
        row.model,
        row.provider,
        row.status,
        row.reason_code,
        row.input_tokens,
        row.cached_input_tokens,
        row.output_tokens,
        row.cost,
        "" if row.latency_ms is None else round(row.latency_ms, 1),
        "" if row.ttft_ms is None else round(row.ttft_ms, 1),
        row.attempts,
        detail.get("queue_wait_ms", ""),
    ]


class _Echo:
    def write(self, value: str) -> str:
        return value


def generations_csv(rows: QuerySet[Generation], filename: str) -> StreamingHttpResponse:
    """``rows`` (already scoped to what the reader may see) as a CSV download."""

    def lines() -> Iterator[str]:
        writer = csv.writer(_Echo())
        yield writer.writerow(COLUMNS)
        batch: list[Generation] = []
        for row in rows.iterator(chunk_size=BATCH):
            batch.append(row)
            if len(batch) == BATCH:
                yield from _batch(writer, batch)
                batch = []
        yield from _batch(writer, batch)

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _batch(writer: Any, batch: list[Generation]) -> Iterator[str]:
    names = CallerNames.of(batch)
    for row in batch:
        yield writer.writerow(_line(row, names))
