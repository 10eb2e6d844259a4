"""Reading the usage ledger: every read takes the tenant, so one tenant never reads another's rows
(and an API key's read of one record also takes its app, so one app never reads another's).

The activity list pages by keyset — "older than this row" — instead of OFFSET and COUNT(*),
which grow with the ledger; the (tenant, created_at) index answers each page directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from gateway.models import Generation

# Status filter values of the activity page (beyond an exact code such as "429").
STATUS_CLASSES = {
    "ok": Q(status__lt=400),
    "4xx": Q(status__gte=400, status__lt=500),
    "5xx": Q(status__gte=500),
}


@dataclass(frozen=True)
class Cursor:
    """Position in a tenant's activity, newest first: rows strictly older than this one."""

    created_at: datetime
    id: str

    def encode(self) -> str:
        return f"{self.created_at.isoformat()}~{self.id}"

    @classmethod
    def decode(cls, raw: str) -> Cursor | None:
        when, sep, generation_id = raw.partition("~")
        if not sep or not generation_id:
            return None
        try:
            created_at = datetime.fromisoformat(when)
        except ValueError:
            return None
        if created_at.tzinfo is None:
            return None
        return cls(created_at=created_at, id=generation_id)


def generation_get(*, tenant_id: int, app_id: int, generation_id: str) -> Generation | None:
    """One ledger row of this tenant's app, or None: another app's or tenant's row looks missing."""
    return Generation.objects.filter(tenant_id=tenant_id, app_id=app_id, id=generation_id).first()


@dataclass(frozen=True)
class ActivityPage:
    rows: list[Generation]
    next: Cursor | None  # where the next (older) page starts; None on the last page


def generation_rows(
    *,
    tenant_id: int,
    model: str = "",
    provider: str = "",
    status: str = "",
    app: int | None = None,
    key: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[Generation]:
    """The tenant's requests matching the activity filters, in no particular order.

    ``status`` is "", "ok", "4xx", "5xx" or an exact code ("429"); ``app`` and ``key`` are ids
    (of this tenant's: another tenant's id matches nothing); ``since`` ≤ created_at < ``until``.
    """
    rows: QuerySet[Generation] = Generation.objects.filter(tenant_id=tenant_id)
    if model:
        rows = rows.filter(model=model)
    if provider:
        rows = rows.filter(provider=provider)
    if status in STATUS_CLASSES:
        rows = rows.filter(STATUS_CLASSES[status])
    elif status.isdigit():
        rows = rows.filter(status=int(status))
    if app is not None:
        rows = rows.filter(app_id=app)
    if key is not None:
        rows = rows.filter(api_key_id=key)
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    if until is not None:
        rows = rows.filter(created_at__lt=until)
    return rows


def generation_list(
    *,
    tenant_id: int,
    before: Cursor | None = None,
    limit: int = 50,
    **filters: Any,
) -> ActivityPage:
    """A page of the tenant's requests, newest first, filtered as ``generation_rows`` filters."""
    rows = generation_rows(tenant_id=tenant_id, **filters).defer("detail")
    if before is not None:
        rows = rows.filter(
            Q(created_at__lt=before.created_at) | Q(created_at=before.created_at, id__lt=before.id)
        )
    page = list(rows.order_by("-created_at", "-id")[: limit + 1])
    if len(page) <= limit:
        return ActivityPage(rows=page, next=None)
    last = page[limit - 1]
    return ActivityPage(rows=page[:limit], next=Cursor(created_at=last.created_at, id=last.id))
