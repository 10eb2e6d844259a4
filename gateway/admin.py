"""Admin for the usage ledger (one row per logical request) and the deferred jobs: read-only; a
tenant member (A4) sees their own tenant's rows only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from gateway.export import CallerNames, generations_csv
from gateway.models import Batch, BatchFile, Generation, Job
from gateway.selectors import STATUS_CLASSES
from tenants.models import ApiKey, App, Tenant
from tenants.scoping import Access, TenantScopedAdmin, tenant_choices


class TenantFilter(admin.SimpleListFilter):
    """The ledger keeps tenant ids (rows outlive renames); filter by the tenant's name."""

    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        tenants = tenant_choices(model_admin.admin_site, request, Tenant)
        return [(str(pk), name) for pk, name in tenants.values_list("pk", "name")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[Generation]
    ) -> QuerySet[Generation]:
        value = self.value()
        return queryset.filter(tenant_id=int(value)) if value and value.isdigit() else queryset


class AppFilter(admin.SimpleListFilter):
    title = "app"
    parameter_name = "app"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        apps = tenant_choices(model_admin.admin_site, request, App).select_related("team__tenant")
        return [(str(app.pk), f"{app.team.tenant.name}/{app.team.name}/{app.name}") for app in apps]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(app_id=int(value)) if value and value.isdigit() else queryset


class KeyFilter(admin.SimpleListFilter):
    title = "API key"
    parameter_name = "key"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        keys = tenant_choices(model_admin.admin_site, request, ApiKey).select_related("app")
        return [(str(k.pk), f"{k.prefix}… {k.app.name}/{k.name}") for k in keys]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(api_key_id=int(value)) if value and value.isdigit() else queryset


class StatusClassFilter(admin.SimpleListFilter):
    title = "status class"
    parameter_name = "status_class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("ok", "succeeded (below 400)"), ("4xx", "4xx"), ("5xx", "5xx")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(STATUS_CLASSES[value]) if value in STATUS_CLASSES else queryset


class TenantRowsAdmin(TenantScopedAdmin):
    """Rows that keep their tenant's id (they outlive renames): shown with its name, read-only."""

    tenant_lookup = "tenant_id"
    tenant_access = Access.VIEW

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        names = Tenant.objects.filter(pk=OuterRef("tenant_id")).values("name")[:1]
        return super().get_queryset(request).annotate(tenant_name=Subquery(names))

    @admin.display(description="tenant", ordering="tenant_name")
    def tenant(self, row: Any) -> str:
        return row.tenant_name or f"#{row.tenant_id}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Generation)
class GenerationAdmin(TenantRowsAdmin):
    list_display = [
        "created_at",
        "tenant",
        "model",
        "provider",
        "status",
        "input_tokens",
        "output_tokens",
        "cost",
        "latency_ms",
        "reason_code",
    ]
    list_filter = [
        TenantFilter,
        AppFilter,
        KeyFilter,
        "model",
        "provider",
        StatusClassFilter,
        "status",
        "created_at",
        "workload_class",
        "reason_code",
        "streamed",
    ]
    search_fields = ["id", "model", "provider", "upstream_model", "reason_code"]
    date_hierarchy = "created_at"
    # The ledger grows fast: skip the unfiltered COUNT(*) on every page.
    show_full_result_count = False
    actions = ["export_csv"]
    fieldsets = [
        (
            "Request",
            {
                "fields": [
                    "id",
                    "created_at",
                    "status",
                    "reason_code",
                    "finish_reason",
                    "streamed",
                    "cancelled",
                ]
            },
        ),
        ("Caller", {"fields": ["tenant", "team", "app", "key", "workload_class"]}),
        ("Route", {"fields": ["model", "degraded_from", "provider", "upstream_model", "route"]}),
        (
            "Usage",
            {
                "fields": [
                    "input_tokens",
                    "cached_input_tokens",
                    "output_tokens",
                    "estimated_input_tokens",
                    "estimated_output_tokens",
                    "cost",
                ]
            },
        ),
        ("Timing", {"fields": ["latency", "ttft", "queue_wait", "attempts", "timeline"]}),
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # Every field shown is read-only; none of them is the raw ``detail`` JSON.
        return [field for _, options in self.fieldsets for field in options["fields"]]

    def _names(self, row: Generation) -> CallerNames:
        names = row.__dict__.get("_caller_names")
        if names is None:
            names = row.__dict__["_caller_names"] = CallerNames.of([row])
        return names

    def _detail(self, row: Generation) -> dict[str, Any]:
        return row.detail if isinstance(row.detail, dict) else {}

    @admin.display(description="team")
    def team(self, row: Generation) -> str:
        return self._names(row).teams.get(row.team_id or 0, "—")

    @admin.display(description="app")
    def app(self, row: Generation) -> str:
        return self._names(row).apps.get(row.app_id or 0, "—")

    @admin.display(description="API key")
    def key(self, row: Generation) -> str:
        prefix = self._names(row).key_prefixes.get(row.api_key_id or 0)
        return f"{prefix}…" if prefix else "—"

    @admin.display(description="degraded from")
    def degraded_from(self, row: Generation) -> str:
        return str(self._detail(row).get("degraded_from") or "—")

    @admin.display(description="route")
    def route(self, row: Generation) -> str:
        return str(self._detail(row).get("route") or "—")

    @admin.display(description="latency (ms)")
    def latency(self, row: Generation) -> str:
        return _ms(row.latency_ms)

    @admin.display(description="time to first token (ms)")
    def ttft(self, row: Generation) -> str:
        return _ms(row.ttft_ms)

    @admin.display(description="queue wait (ms)")
    def queue_wait(self, row: Generation) -> str:
        return _ms(self._detail(row).get("queue_wait_ms"))

    @admin.display(description="attempt timeline")
    def timeline(self, row: Generation) -> SafeString | str:
        return timeline_table(self._detail(row))

    @admin.action(description="Export selected requests as CSV", permissions=["view"])
    def export_csv(self, request: HttpRequest, queryset: QuerySet[Generation]) -> Any:
        return generations_csv(queryset.order_by("-created_at", "-id"), "generations.csv")


def _ms(value: Any) -> str:
    return "—" if value is None or value == "" else f"{float(value):,.1f}"


def timeline_table(detail: dict[str, Any]) -> SafeString | str:
    """The attempts of one request as a table: where each went, how it ended, how long it took,
    and what came next (a retry, the next endpoint, a fallback model, giving up)."""
    steps = [s for s in detail.get("attempts") or [] if isinstance(s, dict)]
    passed_over = ", ".join(str(e) for e in detail.get("explanation") or [])
    if not steps:
        return f"no attempt recorded; passed over: {passed_over}" if passed_over else "—"
    rows = format_html_join(
        "",
        '<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td>'
        '<td class="num">{}</td><td>{}</td></tr>',
        (
            (
                n,
                step.get("provider", ""),
                step.get("model", ""),
                step.get("outcome", ""),
                _ms(step.get("queue_wait_ms")),
                _ms(step.get("ms")),
                str(step.get("next", "")).replace("_", " ") or "—",
            )
            for n, step in enumerate(steps, start=1)
        ),
    )
    return format_html(
        '<table class="attempt-timeline"><thead><tr><th>#</th><th>provider</th><th>model</th>'
        "<th>outcome</th><th>queue wait (ms)</th><th>duration (ms)</th><th>then</th></tr>"
        "</thead><tbody>{}</tbody></table>{}",
        rows,
        format_html("<p>passed over: {}</p>", passed_over) if passed_over else "",
    )


@admin.register(Job)
class JobAdmin(TenantRowsAdmin):
    """Deferred requests (E3, E5): what waits, runs, or ended, and how often it was tried."""

    list_display = [
        "created_at",
        "tenant",
        "model",
        "workload_class",
        "status",
        "tries",
        "lost_runs",
        "next_try_at",
        "deadline_at",
        "response_status",
    ]
    list_filter = [TenantFilter, "status", "workload_class"]
    search_fields = ["id", "generation_id", "model"]
    date_hierarchy = "created_at"
    show_full_result_count = False


@admin.register(Batch)
class BatchAdmin(TenantRowsAdmin):
    """The Batch API's batches (E5): where each stands, read-only; its lines are jobs."""

    # Where it stands first, the long id last: the list fits a 1280 px window beside the
    # admin's sidebar.
    list_display = ["created_at", "status", "progress", "tenant", "endpoint", "id", "expires_at"]
    list_filter = [TenantFilter, "status", "endpoint", "path"]
    search_fields = ["id", "input_file__id", "provider_batch_id"]
    date_hierarchy = "created_at"
    show_full_result_count = False

    @admin.display(description="lines done")
    def progress(self, batch: Batch) -> str:
        done = f"{batch.completed + batch.failed:,} / {batch.total:,}"
        return f"{done} · {batch.failed:,} failed" if batch.failed else done


@admin.register(BatchFile)
class BatchFileAdmin(TenantRowsAdmin):
    """Batch input, output and error files (E5), read-only; the bytes are not shown."""

    list_display = ["created_at", "id", "tenant", "purpose", "filename", "bytes", "lines"]
    list_filter = [TenantFilter, "purpose"]
    search_fields = ["id", "filename"]
    exclude = ["content"]
    date_hierarchy = "created_at"
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).defer("content")
