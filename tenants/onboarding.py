"""Making a tenant admin (SPEC A4): one user account, one membership, staff so it signs in.

The membership, not Django's permission checkboxes, decides what a member sees and may do
(tenants/scoping.py), so a tenant admin needs no group or model permission of its own.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model

from tenants.models import Tenant, TenantMembership
from tenants.scoping import membership_grant


class NotATenantUser(ValueError):
    """The account is platform staff (a superuser): a membership would not restrict it."""


@dataclass(frozen=True)
class TenantAdminGrant:
    user: Any
    membership: TenantMembership
    created: bool
    password: str | None  # set when the account had no usable password (shown once)


def tenant_admin_make(
    *, tenant: Tenant, email: str, role: str = TenantMembership.Role.ADMIN
) -> TenantAdminGrant:
    """Create or update the account of ``email`` (its username) as a member of ``tenant``.

    An account that already signs in keeps its password; a new one (or one without a usable
    password) gets a generated password, returned once. A member of another tenant moves to
    this one: a user belongs to one tenant.
    """
    users = get_user_model().objects
    user = users.filter(username__iexact=email).first() or users.filter(email__iexact=email).first()
    created = user is None
    if user is None:
        user = users.create_user(username=email, email=email)
    if user.is_superuser:
        raise NotATenantUser(f"{user.username} is a superuser (platform staff), not a tenant user")
    password = None
    if not user.has_usable_password():
        password = secrets.token_urlsafe(12)
        user.set_password(password)
    user.email = user.email or email
    user.is_active = True
    user.save()
    membership = membership_grant(user=user, tenant=tenant, role=role)
    return TenantAdminGrant(user=user, membership=membership, created=created, password=password)
