"""A documented way to make a tenant admin (SPEC A4): ``manage.py tenant_admin TENANT EMAIL``
and the tenant list's action; the account then signs in and sees only that tenant."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from tenants.models import ApiKey, Tenant, TenantMembership
from tests.personas import Personas, admin_url


def tenant_admin(*args: str) -> str:
    out = StringIO()
    call_command("tenant_admin", *args, stdout=out)
    return out.getvalue()


def test_the_command_makes_a_new_tenant_admin_who_sees_only_their_tenant(
    personas: Personas,
) -> None:
    output = tenant_admin("acme", "dana@example.com")

    [password] = re.findall(r"password: (\S+)", output)
    user = User.objects.get(username="dana@example.com")
    assert user.is_staff and not user.is_superuser and user.check_password(password)
    membership = TenantMembership.objects.get(user=user)
    assert (membership.tenant, membership.role) == (personas.acme, "admin")
    client = Client()
    assert client.login(username="dana@example.com", password=password)
    keys = client.get(admin_url(ApiKey, "changelist")).context["cl"].result_list
    assert keys and {k.app.team.tenant_id for k in keys} == {personas.acme.pk}
    assert client.get(admin_url(ApiKey, "add")).status_code == 200  # an admin, not a viewer


def test_the_command_updates_an_existing_account_and_keeps_its_password(
    personas: Personas,
) -> None:
    User.objects.create_user("erin@example.com", password="her-own-password")

    output = tenant_admin("globex", "erin@example.com", "--viewer")

    assert "password: unchanged" in output
    user = User.objects.get(username="erin@example.com")
    assert user.check_password("her-own-password") and user.is_staff
    assert user.tenant_membership.tenant == personas.globex
    assert user.tenant_membership.role == "viewer"


@pytest.mark.parametrize(
    ("args", "words"),
    [(("nosuch", "x@example.com"), "no tenant named 'nosuch'"), (("acme", "staff"), "superuser")],
)
def test_the_command_refuses_what_it_cannot_do(
    personas: Personas, args: tuple[str, str], words: str
) -> None:
    with pytest.raises(CommandError, match=words):
        tenant_admin(*args)


def test_the_tenant_action_makes_a_tenant_admin(personas: Personas) -> None:
    client = personas.client(personas.staff)
    action = {"action": "make_tenant_admin", "_selected_action": [personas.globex.pk]}

    form = client.post(admin_url(Tenant, "changelist"), action)
    done = client.post(
        admin_url(Tenant, "changelist"), {**action, "email": "fay@example.com", "role": "admin"}
    )

    assert form.status_code == 200 and "email" in form.context["form"].fields
    assert done.status_code == 200 and "no-store" in done["Cache-Control"]
    [password] = re.findall(r'id="tenant-admin-password" value="([^"]+)"', done.content.decode())
    user = User.objects.get(username="fay@example.com")
    assert user.check_password(password)
    assert user.tenant_membership.tenant == personas.globex


def test_a_tenant_admin_is_not_offered_the_action(personas: Personas) -> None:
    client = personas.client(personas.alice)

    listing = client.get(admin_url(Tenant, "changelist"))
    client.post(
        admin_url(Tenant, "changelist"),
        {
            "action": "make_tenant_admin",
            "_selected_action": [personas.acme.pk],
            "email": "mallory@example.com",
            "role": "admin",
        },
    )

    assert "make_tenant_admin" not in listing.content.decode()
    assert not User.objects.filter(username="mallory@example.com").exists()
