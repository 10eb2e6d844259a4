"""Every config admin reloads the gateways on a change (``common/admin.py``) and is
tenant-scoped (SPEC A4, ``tenants/scoping.py``): closed to tenant members unless it opts in."""

from __future__ import annotations

from common.admin import ConfigChangeAdmin, config_changed
from tenants.scoping import TenantScopedAdmin

__all__ = ["ConfigModelAdmin", "config_changed"]


class ConfigModelAdmin(ConfigChangeAdmin, TenantScopedAdmin):
    """Base of every configuration model's admin."""
