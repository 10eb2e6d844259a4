"""SPEC A4: a tenant member signs in to the same admin and sees and edits only their tenant.

Every registered admin is checked for both directions (carol of globex against acme, alice of
acme against globex): lists, add forms, change / delete / history pages, autocomplete.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import models
from django.test import Client
from django.urls import reverse

from gateway.models import Batch, BatchFile, Generation, Job
from quotas.models import Bucket
from routing.models import Endpoint, Model, Provider
from tenants.models import ApiKey, App, Team, Tenant, TenantMembership
from tests.personas import Personas, batch_create, generation_create, job_create, owner_of
from tests.personas import admin_url as url

REGISTRY = sorted(admin.site._registry.items(), key=lambda item: item[0]._meta.label)
# Public reference data a member may read (never change).
CATALOGUE = {Model, Endpoint}
# What must never appear on a page a member of the other tenant sees. acme's own name is part
# of public model slugs ("acme/chat-large"), so its markers are the ones slugs cannot contain.
MARKERS = {
    "acme": [">acme<", "acme/search", "tenant:acme", "sk-sy-test-a", "alice", "bob"],
    "globex": ["globex", "resellerco", "assistant", "sk-sy-test-g", "carol"],
}
# Nor platform secrets and platform-only limits.
PLATFORM_MARKERS = ["alpha-credential", "provider:", "partner:", "model:"]


# The CSRF token is random letters; "bob" turns up in one now and then.
CSRF_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"')


def assert_clean(response: Any, victim: str) -> None:
    html = CSRF_TOKEN.sub("", response.content.decode())
    for marker in [*MARKERS[victim], *PLATFORM_MARKERS]:
        assert marker not in html, f"{marker!r} leaked into {response.request['PATH_INFO']}"


def hidden_from(obj: Any, tenant: Tenant) -> bool:
    return type(obj) not in CATALOGUE and owner_of(obj) != tenant.pk


@pytest.fixture
def ledger(personas: Personas) -> None:
    for n in range(3):
        generation_create(personas.acme, n)
        generation_create(personas.globex, n, model="acme/chat-small", provider="gamma")
        job_create(personas.acme, n)
        job_create(personas.globex, n)
        batch_create(personas.acme, n)
        batch_create(personas.globex, n)


@pytest.mark.parametrize(
    ("model", "model_admin"), REGISTRY, ids=[m._meta.label for m, _ in REGISTRY]
)
def test_it_shows_a_member_nothing_of_another_tenant(
    personas: Personas, ledger: None, model: Any, model_admin: Any
) -> None:
    for user, victim in ((personas.carol, personas.acme), (personas.alice, personas.globex)):
        viewer = TenantMembership.objects.get(user=user).tenant
        client = personas.client(user)

        listing = client.get(url(model, "changelist"))
        assert listing.status_code in (200, 403)
        if listing.status_code == 200:
            assert_clean(listing, victim.name)
            assert not [o for o in listing.context["cl"].result_list if hidden_from(o, viewer)]

        add = client.get(url(model, "add"))
        assert add.status_code in (200, 403)
        if add.status_code == 200:
            assert_clean(add, victim.name)
            for field in add.context["adminform"].form.fields.values():
                choices = getattr(field, "queryset", None)
                if choices is not None:
                    assert not [o for o in choices if hidden_from(o, viewer)], field

        for obj in model._default_manager.all():
            if not hidden_from(obj, viewer):
                continue
            for view in ("change", "delete", "history"):
                answer = client.get(url(model, view, obj.pk))
                assert answer.status_code in (403, 404), (view, obj)
                assert_clean(answer, victim.name)

        for field_name in model_admin.autocomplete_fields:
            remote = model._meta.get_field(field_name).related_model
            found = client.get(
                reverse("admin:autocomplete"),
                {
                    "app_label": model._meta.app_label,
                    "model_name": model._meta.model_name,
                    "field_name": field_name,
                },
            )
            assert found.status_code in (200, 403)
            if found.status_code == 200:
                ids = [r["id"] for r in found.json()["results"]]
                assert not [o for o in remote.objects.filter(pk__in=ids) if hidden_from(o, viewer)]


@pytest.mark.parametrize(
    "model", [Tenant, Team, App, ApiKey, Bucket, Generation, Job, Batch, BatchFile]
)
def test_it_shows_a_member_all_of_their_own_tenant(
    personas: Personas, ledger: None, model: Any
) -> None:
    listing = personas.client(personas.alice).get(url(model, "changelist"))

    shown = {o.pk for o in listing.context["cl"].result_list}
    own = {o.pk for o in model._default_manager.all() if owner_of(o) == personas.acme.pk}
    assert shown == own and own


def test_it_answers_another_tenants_object_exactly_like_a_missing_one(
    personas: Personas,
) -> None:
    client = personas.client(personas.carol)
    team = Team.objects.get(tenant=personas.acme)
    missing = Team.objects.order_by("-pk").first().pk + 1000

    foreign = client.get(url(Team, "change", team.pk))
    absent = client.get(url(Team, "change", missing))

    assert foreign.status_code == absent.status_code == 404
    assert foreign.content.replace(str(team.pk).encode(), b"ID") == absent.content.replace(
        str(missing).encode(), b"ID"
    )


def test_it_lists_only_member_pages_on_the_admin_index(personas: Personas) -> None:
    index = personas.client(personas.alice).get(reverse("admin:index"))

    shown = {m["object_name"] for app in index.context["app_list"] for m in app["models"]}
    assert shown == {
        "Tenant",
        "Team",
        "App",
        "ApiKey",
        "Bucket",
        "Generation",
        "Job",
        "Batch",
        "BatchFile",
        "Model",
        "Endpoint",
    }


def test_it_offers_a_member_only_their_own_apps_for_a_new_key(personas: Personas) -> None:
    client = personas.client(personas.alice)
    globex_app = App.objects.get(team__tenant=personas.globex)
    acme_app = App.objects.get(name="web")
    form = {"name": "laptop", "expires_at_0": "", "expires_at_1": ""}

    page = client.get(url(ApiKey, "add"))
    refused = client.post(url(ApiKey, "add"), {**form, "app": globex_app.pk})
    created = client.post(url(ApiKey, "add"), {**form, "app": acme_app.pk})

    assert set(page.context["adminform"].form.fields["app"].queryset) == set(
        App.objects.filter(team__tenant=personas.acme)
    )
    assert refused.status_code == 200 and "app" in refused.context["adminform"].form.errors
    assert_clean(refused, "globex")
    assert created.status_code == 200 and "sk-sy-" in created.content.decode()
    assert list(ApiKey.objects.filter(name="laptop").values_list("app", flat=True)) == [acme_app.pk]


def test_a_member_may_set_their_tenants_sort_but_not_its_weight_or_partner(
    personas: Personas,
) -> None:
    client = personas.client(personas.alice)
    acme = personas.acme
    page = client.get(url(Tenant, "change", acme.pk))
    data = _resubmission(page)
    data.update({"default_sort": "price", "weight": "100", "partner": "1", "name": "evil"})

    answer = client.post(url(Tenant, "change", acme.pk), data)

    assert answer.status_code == 302, answer.context["errors"]
    acme.refresh_from_db()
    assert (acme.default_sort, acme.weight, acme.partner_id, acme.name) == (
        "price",
        1.0,
        None,
        "acme",
    )
    assert "partner" not in page.context["adminform"].form.fields
    assert client.get(url(Tenant, "add")).status_code == 403
    assert client.post(url(Tenant, "delete", acme.pk), {"post": "yes"}).status_code == 403


def test_a_viewer_reads_their_tenant_but_changes_nothing(personas: Personas) -> None:
    client = personas.client(personas.bob)
    team = Team.objects.get(tenant=personas.acme)

    page = client.get(url(Team, "change", team.pk))
    change = client.post(url(Team, "change", team.pk), {"tenant": personas.acme.pk, "name": "x"})

    assert page.status_code == 200 and not page.context["has_change_permission"]
    assert change.status_code == 403
    assert client.get(url(Team, "add")).status_code == 403
    team.refresh_from_db()
    assert team.name == "search"


def test_a_member_edits_app_limits_but_only_reads_the_tenant_wide_ones(
    personas: Personas,
) -> None:
    client = personas.client(personas.alice)
    tenant_wide = Bucket.objects.filter(scope_kind="tenant", tenant=personas.acme).first()
    app_limit = Bucket.objects.get(scope_kind="app", app__name="web")

    assert (
        client.get(url(Bucket, "change", tenant_wide.pk)).context["has_change_permission"] is False
    )
    assert client.post(url(Bucket, "delete", tenant_wide.pk), {"post": "yes"}).status_code == 403
    assert client.get(url(Bucket, "change", app_limit.pk)).context["has_change_permission"]
    tenant_page = client.get(url(Tenant, "change", personas.acme.pk))
    [buckets] = [
        i for i in tenant_page.context["inline_admin_formsets"] if i.formset.model is Bucket
    ]
    assert not buckets.has_change_permission and not buckets.has_add_permission


BUCKET = {
    "name": "",
    "source": "configured",
    "dimension": "requests",
    "rule": "refill",
    "capacity": "10",
    "period_seconds": "60",
}


@pytest.mark.parametrize("scope_kind", ["tenant", "partner", "provider", "model"])
def test_a_member_cannot_add_a_limit_outside_their_teams_apps_and_keys(
    personas: Personas, scope_kind: str
) -> None:
    owners = {
        "tenant": personas.acme,
        "partner": personas.globex.partner,
        "provider": Provider.objects.get(name="alpha"),
        "model": Model.objects.first(),
    }
    count = Bucket.objects.count()

    answer = personas.client(personas.alice).post(
        url(Bucket, "add"),
        {**BUCKET, "scope_kind": scope_kind, scope_kind: owners[scope_kind].pk},
    )

    assert answer.status_code == 200
    assert Bucket.objects.count() == count


def test_a_members_limit_names_start_with_their_scope(personas: Personas) -> None:
    client = personas.client(personas.alice)
    app = App.objects.get(name="web")
    taken = Bucket.objects.get(scope_kind="tenant", tenant=personas.globex).name

    clash = client.post(
        url(Bucket, "add"), {**BUCKET, "scope_kind": "app", "app": app.pk, "name": taken}
    )
    derived = client.post(url(Bucket, "add"), {**BUCKET, "scope_kind": "app", "app": app.pk})

    errors = str(clash.context["adminform"].form.errors)  # the page echoes alice's own input
    assert "app:acme/search/web:" in errors and "exist" not in errors
    assert derived.status_code == 302
    assert Bucket.objects.filter(name="app:acme/search/web:requests:1m", app=app).exists()


def test_actions_cannot_reach_another_tenants_objects(personas: Personas) -> None:
    client = personas.client(personas.alice)
    globex_keys = list(ApiKey.objects.filter(app__team__tenant=personas.globex))
    globex_teams = list(Team.objects.filter(tenant=personas.globex))

    client.post(
        url(ApiKey, "changelist"),
        {"action": "revoke_keys", "_selected_action": [k.pk for k in globex_keys]},
    )
    client.post(
        url(Team, "changelist"),
        {
            "action": "delete_selected",
            "post": "yes",
            "_selected_action": [t.pk for t in globex_teams],
        },
    )

    assert not ApiKey.objects.filter(app__team__tenant=personas.globex, revoked_at__isnull=False)
    assert Team.objects.filter(tenant=personas.globex).count() == len(globex_teams)


def test_an_inline_cannot_be_pointed_at_another_tenants_object(personas: Personas) -> None:
    client = personas.client(personas.alice)
    team = Team.objects.get(tenant=personas.acme)
    globex_app = App.objects.get(team__tenant=personas.globex)
    data = _resubmission(client.get(url(Team, "change", team.pk)))
    data.update({"apps-0-id": str(globex_app.pk), "apps-0-name": "stolen"})

    client.post(url(Team, "change", team.pk), data)

    globex_app.refresh_from_db()
    assert (globex_app.name, globex_app.team.tenant_id) == ("assistant", personas.globex.pk)


def test_platform_staff_see_every_tenant(personas: Personas, ledger: None) -> None:
    client = personas.client(personas.staff)

    for model in (Tenant, Team, ApiKey, Generation, Job):
        listing = client.get(url(model, "changelist"))
        owners = {owner_of(o) for o in listing.context["cl"].result_list}
        assert owners == {personas.acme.pk, personas.globex.pk}


def test_staff_make_a_user_a_member_who_can_sign_in(personas: Personas) -> None:
    dave = User.objects.create_user("dave")

    personas.client(personas.staff).post(
        url(TenantMembership, "add"),
        {"user": dave.pk, "tenant": personas.globex.pk, "role": "viewer"},
    )

    dave.refresh_from_db()
    assert dave.is_staff and not dave.is_superuser
    assert dave.tenant_membership.tenant == personas.globex
    assert (
        personas.client(personas.alice).get(url(TenantMembership, "changelist")).status_code == 403
    )


def test_a_member_without_staff_sign_in_is_sent_to_the_login(personas: Personas) -> None:
    client = Client()
    page = client.get(url(Team, "changelist"))

    assert page.status_code == 302 and "/login/" in page["Location"]


def _resubmission(page: Any) -> dict[str, Any]:
    """The POST data that saves a change form as it was rendered (main form and inlines)."""
    from django import forms

    data: dict[str, Any] = {}

    def add(form: forms.BaseForm) -> None:
        for name, field in form.fields.items():
            value = form[name].value()
            if isinstance(field, forms.BooleanField):
                if value:
                    data[form.add_prefix(name)] = "on"
            elif isinstance(value, models.Model):
                data[form.add_prefix(name)] = value.pk
            else:
                data[form.add_prefix(name)] = "" if value is None else value

    add(page.context["adminform"].form)
    for inline in page.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        data.update({management.add_prefix(k): v for k, v in management.initial.items()})
        for form in inline.formset.initial_forms:
            add(form)
    return data


def test_a_member_adds_a_team_to_their_own_tenant(personas: Personas) -> None:
    client = personas.client(personas.alice)

    inline = {"apps-TOTAL_FORMS": "0", "apps-INITIAL_FORMS": "0"}

    page = client.get(url(Team, "add"))
    added = client.post(
        url(Team, "add"), {**inline, "tenant": personas.acme.pk, "name": "research"}
    )
    foreign = client.post(
        url(Team, "add"), {**inline, "tenant": personas.globex.pk, "name": "planted"}
    )

    assert page.context["adminform"].form.initial["tenant"] == personas.acme.pk
    assert added.status_code == 302
    assert Team.objects.get(name="research").tenant == personas.acme
    assert foreign.status_code == 200 and not Team.objects.filter(name="planted").exists()
