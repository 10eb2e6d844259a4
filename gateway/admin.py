"""Admin for the usage ledger: read-only, one row per logical request; a tenant member (A4) sees
their own tenant's rows only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest

from gateway.models import Generation
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


@admin.register(Generation)
class GenerationAdmin(TenantScopedAdmin):
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
    tenant_lookup = "tenant_id"
    tenant_access = Access.VIEW

    def get_queryset(self, request: HttpRequest) -> QuerySet[Generation]:
        names = Tenant.objects.filter(pk=OuterRef("tenant_id")).values("name")[:1]
        return super().get_queryset(request).annotate(tenant_name=Subquery(names))

    @admin.display(description="tenant", ordering="tenant_name")
    def tenant(self, generation: Any) -> str:
        return generation.tenant_name or f"#{generation.tenant_id}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
