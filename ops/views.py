"""Thin views: check who may see the tenant, read through a selector, render."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from gateway.export import generations_csv
from gateway.selectors import Cursor, generation_list, generation_rows
from ops.forms import ActivityFilterForm
from ops.saturation import saturation_page
from ops.selectors import SPANS
from ops.tabs import tenant_tabs
from tenants.scoping import tenant_get_visible, tenant_member

ACTIVITY_PAGE_SIZE = 50


def tenant_activity(request: HttpRequest, tenant: str) -> HttpResponse | StreamingHttpResponse:
    """A tenant's recent requests, newest first, filterable, paged by keyset (G15, H3); with
    ``format=csv``, every request matching the filters as a CSV download."""
    owner = tenant_get_visible(user=request.user, name=tenant)
    form = ActivityFilterForm(request.GET or None, tenant=owner)
    filters, query = form.filters(), form.query()
    if request.GET.get("format") == "csv":
        rows = generation_rows(tenant_id=owner.pk, **filters).order_by("-created_at", "-id")
        return generations_csv(rows, f"{owner.name}-activity.csv")
    before = Cursor.decode(request.GET.get("before", ""))
    page = generation_list(tenant_id=owner.pk, before=before, limit=ACTIVITY_PAGE_SIZE, **filters)
    context = {
        **admin.site.each_context(request),
        "title": f"{owner.name}: activity",
        "tenant": owner,
        "tabs": tenant_tabs(owner, active="activity"),
        "tab_label": "Activity",
        "form": form,
        "rows": page.rows,
        "csv_url": f"?{urlencode({**query, 'format': 'csv'})}",
        "first_url": f"?{urlencode(query)}" if before is not None else None,
        "next_url": f"?{urlencode({**query, 'before': page.next.encode()})}" if page.next else None,
    }
    return TemplateResponse(request, "ops/tenant_activity.html", context)


def tenant_saturation(request: HttpRequest, tenant: str) -> HttpResponse:
    """Live bucket levels and per-interval charts of a tenant's traffic (H2, H3)."""
    owner = tenant_get_visible(user=request.user, name=tenant)
    span = SPANS.get(request.GET.get("span", ""), SPANS["1h"])
    # Shared pools and other tenants' traffic are for platform staff only (A4).
    staff = tenant_member(request.user) is None
    page = saturation_page(tenant=owner, span=span, now=timezone.now(), staff=staff)
    context = {
        **admin.site.each_context(request),
        "title": f"{owner.name}: saturation",
        "tenant": owner,
        "tabs": tenant_tabs(owner, active="saturation"),
        "tab_label": "Saturation",
        "spans": [(s, s.key == span.key) for s in SPANS.values()],
        "page": page,
        "staff": staff,
    }
    return TemplateResponse(request, "ops/tenant_saturation.html", context)
