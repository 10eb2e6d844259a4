"""Admin for the usage ledger (one row per logical request) and the deferred jobs: read-only; a
tenant member (A4) sees their own tenant's rows only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest

from gateway.models import Generation, Job
from tenants.models import Tenant
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
    list_filter = [TenantFilter, "status", "provider", "workload_class", "reason_code", "streamed"]
    search_fields = ["id", "model", "provider", "upstream_model", "reason_code"]
    date_hierarchy = "created_at"
    # The ledger grows fast: skip the unfiltered COUNT(*) on every page.
    show_full_result_count = False


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
