"""``manage.py tenant_admin TENANT EMAIL``: make someone the admin (or viewer) of one tenant."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from tenants.models import Tenant, TenantMembership
from tenants.onboarding import NotATenantUser, tenant_admin_make


class Command(BaseCommand):
    help = (
        "Create or update the admin account EMAIL as a member of TENANT: it signs in to the "
        "admin and sees only that tenant. Prints a generated password for a new account."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the tenant's name")
        parser.add_argument("email", help="the person's e-mail, also their username")
        parser.add_argument(
            "--viewer", action="store_true", help="read-only member instead of tenant admin"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(name=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant named '{options['tenant']}'")
        role = TenantMembership.Role.VIEWER if options["viewer"] else TenantMembership.Role.ADMIN
        try:
            grant = tenant_admin_make(tenant=tenant, email=options["email"], role=role)
        except NotATenantUser as error:
            raise CommandError(str(error)) from None
        verb = "created" if grant.created else "updated"
        self.stdout.write(f"{verb} {grant.user.username}: {role} of tenant {tenant.name}")
        self.stdout.write(f"sign in at {reverse('admin:index')}")
        if grant.password is not None:
            self.stdout.write(f"password: {grant.password}")
        else:
            self.stdout.write("password: unchanged (the account already had one)")
