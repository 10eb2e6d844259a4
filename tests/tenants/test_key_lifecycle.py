"""API keys are revoked or rotated, never deleted (SPEC A2): the admin offers no way to delete
one, a rotated key's new secret is shown once, and its old secret keeps working — resolved
from the in-memory key index, by the caller's clock — until the overlap ends."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from tenants.identity import key_index_build
from tenants.keys import key_hash
from tenants.models import ApiKey, App, Team, Tenant
from tests.personas import ACME_KEY, Personas, admin_url
from tests.tenants.test_admin_scoping import _resubmission


def acme_web_key() -> ApiKey:
    return ApiKey.objects.get(secret_hash=key_hash(ACME_KEY))


def rotate(client: Client, key: ApiKey, action: str = "rotate_keys") -> list[str]:
    answer = client.post(
        admin_url(ApiKey, "changelist"), {"action": action, "_selected_action": [key.pk]}
    )
    assert answer.status_code == 200
    assert "no-store" in answer["Cache-Control"]
    return re.findall(r'value="(sk-sy-[^"]+)"', answer.content.decode())


@pytest.mark.parametrize("user", ["staff", "alice"])
def test_a_key_has_no_delete_button_or_action(personas: Personas, user: str) -> None:
    client = personas.client(getattr(personas, user))
    key = acme_web_key()

    page = client.get(admin_url(ApiKey, "change", key.pk)).content.decode()
    listing = client.get(admin_url(ApiKey, "changelist"))
    deleting = client.post(admin_url(ApiKey, "delete", key.pk), {"post": "yes"})
    bulk = client.post(
        admin_url(ApiKey, "changelist"),
        {"action": "delete_selected", "post": "yes", "_selected_action": [key.pk]},
    )

    assert admin_url(ApiKey, "delete", key.pk) not in page
    assert (
        "delete_selected" not in listing.context["action_form"].fields["action"].choices.__str__()
    )
    assert deleting.status_code == 403
    assert bulk.status_code in (200, 302)
    assert ApiKey.objects.filter(pk=key.pk).exists()


def test_an_app_with_keys_cannot_be_deleted_with_them(personas: Personas) -> None:
    client = personas.client(personas.staff)
    app = acme_web_key().app

    page = client.post(admin_url(App, "delete", app.pk), {"post": "yes"})

    assert page.status_code == 200 and "Cannot delete app" in page.content.decode()
    assert ApiKey.objects.filter(app=app).exists()


def test_a_team_inline_cannot_delete_an_app_with_keys(personas: Personas) -> None:
    client = personas.client(personas.alice)
    app = acme_web_key().app
    page = client.get(admin_url(Team, "change", app.team_id))
    data = _resubmission(page)
    [row] = [k for k, v in data.items() if k.endswith("-id") and str(v) == str(app.pk)]
    data[row.replace("-id", "-DELETE")] = "on"

    answer = client.post(admin_url(Team, "change", app.team_id), data)

    assert answer.status_code == 200  # refused, the form shown again with the reason
    assert "protected" in answer.content.decode()
    assert App.objects.filter(pk=app.pk).exists() and ApiKey.objects.filter(app=app).exists()


def test_a_tenant_with_keys_cannot_be_deleted(personas: Personas) -> None:
    client = personas.client(personas.staff)

    client.post(admin_url(Tenant, "delete", personas.acme.pk), {"post": "yes"})

    assert Tenant.objects.filter(pk=personas.acme.pk).exists()


def test_rotation_shows_a_new_secret_once_and_keeps_the_old_one_for_the_overlap(
    personas: Personas, settings: Any
) -> None:
    settings.KEY_ROTATION_OVERLAP_SECONDS = 3600
    key = acme_web_key()
    before = timezone.now()

    [secret] = rotate(personas.client(personas.alice), key)

    key.refresh_from_db()
    assert (key.secret_hash, key.prefix) == (key_hash(secret), secret[:12])
    assert key.previous_secret_hash == key_hash(ACME_KEY)
    assert key.previous_valid_until is not None
    assert before + timedelta(seconds=3600) <= key.previous_valid_until
    index, t = key_index_build(), key.previous_valid_until.timestamp()
    new, old = index.identify(secret, now=t + 1e6), index.identify(ACME_KEY, now=t - 1)
    assert new is not None and new.key_id == key.pk
    assert old is not None and old.key_id == key.pk
    assert index.identify(ACME_KEY, now=t) is None  # the overlap is over
    page = personas.client(personas.alice).get(admin_url(ApiKey, "change", key.pk))
    assert secret not in page.content.decode()


def test_rotate_now_stops_the_old_secret_at_once(personas: Personas) -> None:
    key = acme_web_key()

    [secret] = rotate(personas.client(personas.staff), key, "rotate_keys_now")

    index, now = key_index_build(), timezone.now().timestamp()
    assert index.identify(ACME_KEY, now=now) is None
    assert index.identify(secret, now=now) is not None


def test_the_old_secret_stops_no_later_than_the_key_expires(
    personas: Personas, settings: Any
) -> None:
    settings.KEY_ROTATION_OVERLAP_SECONDS = 3600
    key = acme_web_key()
    expires = timezone.now() + timedelta(minutes=10)
    ApiKey.objects.filter(pk=key.pk).update(expires_at=expires)

    rotate(personas.client(personas.staff), key)

    index = key_index_build()
    assert index.identify(ACME_KEY, now=expires.timestamp() - 1) is not None
    assert index.identify(ACME_KEY, now=expires.timestamp()) is None


def test_revoking_a_rotated_key_stops_both_secrets(personas: Personas) -> None:
    client = personas.client(personas.staff)
    key = acme_web_key()
    [secret] = rotate(client, key)

    client.post(
        admin_url(ApiKey, "changelist"), {"action": "revoke_keys", "_selected_action": [key.pk]}
    )

    index, now = key_index_build(), timezone.now().timestamp()
    assert index.identify(secret, now=now) is None
    assert index.identify(ACME_KEY, now=now) is None


def test_a_member_cannot_rotate_another_tenants_key(personas: Personas) -> None:
    globex_key = ApiKey.objects.filter(app__team__tenant=personas.globex).first()
    hash_before = globex_key.secret_hash

    personas.client(personas.alice).post(
        admin_url(ApiKey, "changelist"),
        {"action": "rotate_keys", "_selected_action": [globex_key.pk]},
    )

    globex_key.refresh_from_db()
    assert globex_key.secret_hash == hash_before


def test_a_secret_set_back_as_current_does_not_expire_with_the_overlap(
    personas: Personas,
) -> None:
    key = acme_web_key()
    rotate(personas.client(personas.staff), key)
    key.refresh_from_db()
    # loadconfig writes the file's secret back (the file is the source of truth for it).
    ApiKey.objects.filter(pk=key.pk).update(secret_hash=key_hash(ACME_KEY), prefix=ACME_KEY[:12])

    index = key_index_build()

    assert key.previous_valid_until is not None
    assert index.identify(ACME_KEY, now=key.previous_valid_until.timestamp() + 1) is not None
