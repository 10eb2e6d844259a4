"""The tabs of a tenant's ops pages. A new page adds a ``Tab`` here and its URL in ``urls.py``."""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import reverse

from tenants.models import Tenant


@dataclass(frozen=True)
class Tab:
    key: str
    label: str
    url_name: str  # reversed with the tenant's name


TENANT_TABS: list[Tab] = [
    Tab("activity", "Activity", "ops:tenant-activity"),
    Tab("saturation", "Saturation", "ops:tenant-saturation"),
]


@dataclass(frozen=True)
class TabLink:
    label: str
    url: str
    active: bool


def tenant_tabs(tenant: Tenant, *, active: str) -> list[TabLink]:
    return [
        TabLink(tab.label, reverse(tab.url_name, args=[tenant.name]), tab.key == active)
        for tab in TENANT_TABS
    ]
