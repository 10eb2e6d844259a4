"""The admin as a superuser, with the reference configuration loaded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django import forms
from django.contrib import admin
from django.test import Client, RequestFactory

from common import redis as gateway_redis
from configfile.apply import config_load
from quotas.models import Bucket
from routing.models import Credential, Provider
from tenants.keys import key_hash
from tenants.models import ApiKey, App, Tenant
from tests.personas import admin_url as url

REFERENCE = Path(__file__).resolve().parents[2] / "config" / "switchyard.yaml"
ALPHA_SECRET = "alpha-provider-credential-do-not-render"


@pytest.fixture
def reference_config(db: None, redis_prefix: str) -> None:
    """The reference file loaded, with alpha's credential set."""
    config_load(REFERENCE, env={"ALPHA_API_KEY": ALPHA_SECRET})


pytestmark = pytest.mark.usefixtures("reference_config")

REGISTRY = sorted(admin.site._registry.items(), key=lambda item: item[0]._meta.label)


def config_version() -> int:
    raw = gateway_redis.sync_client().get(gateway_redis.key("config", "version"))
    return int(raw or 0)


@pytest.mark.parametrize(
    ("model", "model_admin"), REGISTRY, ids=[m._meta.label for m, _ in REGISTRY]
)
def test_it_serves_the_pages_of_every_registered_model(
    admin_client: Client, admin_user: Any, model: Any, model_admin: Any
) -> None:
    request = RequestFactory().get("/")
    request.user = admin_user

    assert admin_client.get(url(model, "changelist")).status_code == 200
    assert admin_client.get(url(model, "changelist"), {"q": "a"}).status_code == 200
    expected = 200 if model_admin.has_add_permission(request) else 403
    assert admin_client.get(url(model, "add")).status_code == expected
    first = model._default_manager.first()
    if first is not None:
        assert admin_client.get(url(model, "change", first.pk)).status_code == 200


def test_it_registers_every_switchyard_model() -> None:
    labels = {model._meta.label for model in admin.site._registry}

    assert labels >= {
        "tenants.Partner",
        "tenants.Tenant",
        "tenants.Team",
        "tenants.App",
        "tenants.ApiKey",
        "routing.Provider",
        "routing.Model",
        "routing.Endpoint",
        "quotas.WorkloadClass",
        "quotas.Bucket",
        "gateway.Generation",
    }


def test_it_shows_a_new_keys_secret_once_and_stores_its_hash(admin_client: Client) -> None:
    app = App.objects.get(name="web")

    response = admin_client.post(
        url(ApiKey, "add"),
        {
            "app": app.pk,
            "name": "laptop",
            "expires_at_0": "",
            "expires_at_1": "",
        },
    )

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    [secret] = re.findall(r'value="(sk-sy-[^"]+)"', response.content.decode())
    key = ApiKey.objects.get(name="laptop")
    assert (key.secret_hash, key.prefix) == (key_hash(secret), secret[:12])
    assert secret not in str(ApiKey.objects.filter(pk=key.pk).values().get())
    for page in (
        url(ApiKey, "change", key.pk),
        url(ApiKey, "changelist"),
        url(App, "change", app.pk),
    ):
        assert secret not in admin_client.get(page).content.decode()


def test_it_does_not_let_the_hash_or_prefix_be_edited(admin_client: Client) -> None:
    key = ApiKey.objects.get(app__name="web", name="ci")

    admin_client.post(
        url(ApiKey, "change", key.pk),
        {
            "name": "ci",
            "allowed_models": ["acme/chat-small"],
            "expires_at_0": "",
            "expires_at_1": "",
            "prefix": "sk-sy-forged",
            "secret_hash": "0" * 64,
            "buckets-TOTAL_FORMS": "0",
            "buckets-INITIAL_FORMS": "0",
        },
    )

    key.refresh_from_db()
    assert key.allowed_models == ["acme/chat-small"]
    assert key.secret_hash == key_hash("sk-sy-test-acme-web-0001")


def test_the_revoke_action_revokes_the_selected_keys(
    admin_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    keys = list(ApiKey.objects.filter(app__team__tenant__name="acme"))
    version = config_version()

    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            url(ApiKey, "changelist"),
            {"action": "revoke_keys", "_selected_action": [k.pk for k in keys]},
            follow=True,
        )

    assert response.status_code == 200
    assert "Revoked 2 key(s)." in response.content.decode()
    assert all(k.revoked_at is not None for k in ApiKey.objects.filter(pk__in=[k.pk for k in keys]))
    assert ApiKey.objects.get(app__name="assistant").revoked_at is None
    assert config_version() == version + 1
    revoked = admin_client.get(url(ApiKey, "changelist"), {"status": "revoked"})
    assert len(revoked.context["cl"].result_list) == 2


def test_it_never_renders_a_provider_credential(admin_client: Client) -> None:
    provider = Provider.objects.get(name="alpha")

    page = admin_client.get(url(Provider, "change", provider.pk)).content.decode()
    listing = admin_client.get(url(Provider, "changelist")).content.decode()

    for html in (page, listing):
        assert ALPHA_SECRET not in html
        assert provider.api_key_encrypted not in html
    assert 'name="api_key"' in page


def _provider_form(provider: Provider, **changes: str) -> dict[str, str]:
    data = {
        "name": provider.name,
        "protocol": provider.protocol,
        "base_url": provider.base_url,
        "cache_ttl_seconds": str(provider.cache_ttl_seconds),
        "is_active": "on",
        "api_key": "",
        "buckets-TOTAL_FORMS": "0",
        "buckets-INITIAL_FORMS": "0",
        "projects-TOTAL_FORMS": "0",
        "projects-INITIAL_FORMS": "0",
        "credentials-TOTAL_FORMS": "0",
        "credentials-INITIAL_FORMS": "0",
    }
    data.update(changes)
    return data


def test_a_blank_provider_key_keeps_the_credential_and_a_new_one_replaces_it(
    admin_client: Client,
) -> None:
    provider = Provider.objects.get(name="beta")  # no buckets to resubmit: only the ramp one
    provider.buckets.all().delete()

    admin_client.post(url(Provider, "change", provider.pk), _provider_form(provider, api_key="b-1"))
    provider.refresh_from_db()
    assert provider.get_api_key() == "b-1"

    admin_client.post(url(Provider, "change", provider.pk), _provider_form(provider))
    provider.refresh_from_db()
    assert provider.get_api_key() == "b-1"

    admin_client.post(
        url(Provider, "change", provider.pk), _provider_form(provider, clear_api_key="on")
    )
    provider.refresh_from_db()
    assert provider.api_key_encrypted == ""


def test_a_pool_key_is_added_on_its_page_write_only_and_its_limit_named_from_it(
    admin_client: Client,
) -> None:
    provider = Provider.objects.get(name="alpha")

    response = admin_client.post(
        url(Credential, "add"),
        {
            "provider": provider.pk,
            "name": "key-9",
            "api_key": "sk-pool-secret-9",
            "is_active": "on",
            "buckets-TOTAL_FORMS": "0",
            "buckets-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.context["errors"]
    credential = Credential.objects.get(provider=provider, name="key-9")
    assert credential.get_api_key() == "sk-pool-secret-9"
    for page in (url(Credential, "change", credential.pk), url(Provider, "change", provider.pk)):
        html = admin_client.get(page).content.decode()
        assert "sk-pool-secret-9" not in html and credential.api_key_encrypted not in html
    assert "key-9" in admin_client.get(url(Provider, "change", provider.pk)).content.decode()

    response = admin_client.post(
        url(Bucket, "add"),
        {
            "name": "",
            "source": "configured",
            "scope_kind": "credential",
            "credential": credential.pk,
            "dimension": "requests",
            "rule": "refill",
            "capacity": "60",
            "period_seconds": "60",
        },
    )
    assert response.status_code == 302, response.context["errors"]
    assert Bucket.objects.get(name="credential:alpha/key-9:requests:1m").credential == credential


def resubmission(response: Any) -> dict[str, Any]:
    """The POST data that saves a change form as it was rendered (main form and inlines)."""
    data: dict[str, Any] = {}

    def add(form: forms.BaseForm) -> None:
        for name, field in form.fields.items():
            value = form[name].value()
            if isinstance(field, forms.BooleanField):
                if value:
                    data[form.add_prefix(name)] = "on"
            else:
                data[form.add_prefix(name)] = "" if value is None else value

    add(response.context["adminform"].form)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        management = formset.management_form
        data.update({management.add_prefix(k): v for k, v in management.initial.items()})
        for form in formset.initial_forms:
            add(form)
    return data


def test_a_bucket_added_inline_gets_the_scope_and_a_derived_name(
    admin_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    acme = Tenant.objects.get(name="acme")
    page = admin_client.get(url(Tenant, "change", acme.pk))
    data = resubmission(page)
    n = int(data["buckets-TOTAL_FORMS"])
    data["buckets-TOTAL_FORMS"] = str(n + 1)
    data.update(
        {
            f"buckets-{n}-name": "",
            f"buckets-{n}-dimension": "requests",
            f"buckets-{n}-rule": "refill",
            f"buckets-{n}-capacity": "100",
            f"buckets-{n}-period_seconds": "3600",
            f"buckets-{n}-source": "configured",
        }
    )
    version = config_version()

    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(url(Tenant, "change", acme.pk), data)

    assert response.status_code == 302, response.context["errors"]
    bucket = Bucket.objects.get(name="tenant:acme:requests:1h")
    assert (bucket.scope_kind, bucket.tenant, bucket.capacity) == ("tenant", acme, 100)
    assert acme.buckets.count() == 3
    assert config_version() == version + 1


def test_the_bucket_inline_waits_until_the_scope_exists(admin_client: Client) -> None:
    add = admin_client.get(url(Tenant, "add"))
    change = admin_client.get(url(Tenant, "change", Tenant.objects.get(name="acme").pk))

    def models(page: Any) -> set[Any]:
        return {inline.formset.model for inline in page.context["inline_admin_formsets"]}

    assert Bucket not in models(add)
    assert Bucket in models(change)


def test_a_bucket_added_on_its_own_page_is_named_from_its_scope(admin_client: Client) -> None:
    app = App.objects.get(name="indexer")

    response = admin_client.post(
        url(Bucket, "add"),
        {
            "name": "",
            "source": "configured",
            "scope_kind": "app",
            "app": app.pk,
            "dimension": "spend",
            "rule": "rolling_window",
            "capacity": "5",
            "duration_seconds": "18000",
        },
    )

    assert response.status_code == 302, response.context["errors"]
    assert Bucket.objects.get(name="app:acme/search/indexer:spend:rolling-5h").app == app


def test_a_bucket_with_the_wrong_scope_is_refused(admin_client: Client) -> None:
    response = admin_client.post(
        url(Bucket, "add"),
        {
            "name": "x",
            "source": "configured",
            "scope_kind": "tenant",
            "app": App.objects.get(name="web").pk,
            "dimension": "concurrency",
            "rule": "concurrency",
            "capacity": "5",
        },
    )

    assert response.status_code == 200
    assert not Bucket.objects.filter(name="x").exists()


def test_deleting_a_config_object_bumps_the_version(
    admin_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    bucket = Bucket.objects.get(name="tenant:globex:requests:1m")
    version = config_version()

    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(url(Bucket, "delete", bucket.pk), {"post": "yes"})

    assert not Bucket.objects.filter(pk=bucket.pk).exists()
    assert config_version() == version + 1


def test_the_ledger_is_read_only(admin_client: Client) -> None:
    from gateway.models import Generation

    acme = Tenant.objects.get(name="acme")
    row = Generation.objects.create(
        id="gen-1", tenant_id=acme.pk, model="acme/chat-large", provider="alpha", status=200
    )

    listing = admin_client.get(url(Generation, "changelist"), {"tenant": acme.pk})
    detail = admin_client.get(url(Generation, "change", row.pk))

    assert "acme" in listing.content.decode()
    assert detail.status_code == 200
    assert admin_client.post(url(Generation, "delete", row.pk), {"post": "yes"}).status_code == 403
    assert Generation.objects.filter(pk="gen-1").exists()
