"""Tenants, workload classes and API keys: the admin refuses what ``loadconfig`` refuses (a weight
of 0 fails every request, a string of allowed models refuses every model)."""

from __future__ import annotations

from typing import Any

import pytest
from django import forms
from django.test import Client

from quotas.models import WorkloadClass
from routing.models import Model
from tenants.models import ApiKey, App, Tenant
from tests.personas import Personas, field_errors
from tests.personas import admin_url as url
from tests.tenants.test_admin_scoping import _resubmission

WORKLOAD = {
    "name": "nightly",
    "deadline_seconds": "30",
    "max_queue_depth": "10",
    "overload_action": "defer",
    "weight": "1",
    "retry_budget": "2",
    "stream_reservation": "max",
    "stream_step_tokens": "256",
}


@pytest.mark.parametrize(
    ("field", "value"),
    [("weight", "0"), ("weight", "-1"), ("deadline_seconds", "0"), ("deadline_seconds", "-5")],
)
def test_it_refuses_a_workload_class_loadconfig_refuses(
    personas: Personas, field: str, value: str
) -> None:
    answer = personas.client(personas.staff).post(
        url(WorkloadClass, "add"), {**WORKLOAD, field: value}
    )

    assert "positive" in field_errors(answer, field)
    assert not WorkloadClass.objects.filter(name="nightly").exists()


def test_it_saves_a_good_workload_class(personas: Personas) -> None:
    answer = personas.client(personas.staff).post(
        url(WorkloadClass, "add"), {**WORKLOAD, "weight": "0.25", "deadline_seconds": "0.5"}
    )

    assert answer.status_code == 302
    assert WorkloadClass.objects.get(name="nightly").weight == 0.25


def test_it_refuses_a_step_of_no_tokens_and_saves_a_class_that_streams_in_steps(
    personas: Personas,
) -> None:
    client = personas.client(personas.staff)
    answer = client.post(url(WorkloadClass, "add"), {**WORKLOAD, "stream_step_tokens": "0"})
    assert "positive" in field_errors(answer, "stream_step_tokens")

    answer = client.post(
        url(WorkloadClass, "add"),
        {**WORKLOAD, "stream_reservation": "increments", "stream_step_tokens": "64"},
    )
    assert answer.status_code == 302
    saved = WorkloadClass.objects.get(name="nightly")
    assert (saved.stream_reservation, saved.stream_step_tokens) == ("increments", 64)


def test_it_refuses_a_bad_class_contract_naming_the_clause_and_saves_a_good_or_empty_one(
    personas: Personas,
) -> None:
    client = personas.client(personas.staff)
    answer = client.post(
        url(WorkloadClass, "add"), {**WORKLOAD, "fallback_contract": '{"region": "same"}'}
    )
    assert "unknown clause 'region'" in field_errors(answer, "fallback_contract")

    answer = client.post(
        url(WorkloadClass, "add"), {**WORKLOAD, "fallback_contract": '{"regions": "same"}'}
    )
    assert answer.status_code == 302
    assert WorkloadClass.objects.get(name="nightly").fallback_contract == {"regions": "same"}
    answer = client.post(url(WorkloadClass, "add"), {**WORKLOAD, "name": "plain"})
    assert answer.status_code == 302
    assert WorkloadClass.objects.get(name="plain").fallback_contract == {}  # none: the route's


def _tenant_form(client: Client, tenant: Tenant, **fields: str) -> dict[str, Any]:
    data = _resubmission(client.get(url(Tenant, "change", tenant.pk)))
    data.update(fields)
    return data


@pytest.mark.parametrize("weight", ["0", "-3"])
def test_it_refuses_a_tenant_weight_loadconfig_refuses(personas: Personas, weight: str) -> None:
    client = personas.client(personas.staff)

    answer = client.post(
        url(Tenant, "change", personas.acme.pk), _tenant_form(client, personas.acme, weight=weight)
    )

    assert "positive" in field_errors(answer, "weight")
    personas.acme.refresh_from_db()
    assert personas.acme.weight == 1.0


def test_it_saves_a_good_tenant_weight(personas: Personas) -> None:
    client = personas.client(personas.staff)

    answer = client.post(
        url(Tenant, "change", personas.acme.pk), _tenant_form(client, personas.acme, weight="2.5")
    )

    assert answer.status_code == 302
    personas.acme.refresh_from_db()
    assert personas.acme.weight == 2.5


def test_a_bad_weight_the_member_cannot_edit_does_not_block_their_changes(
    personas: Personas,
) -> None:
    Tenant.objects.filter(pk=personas.acme.pk).update(weight=0)  # saved before validation
    client = personas.client(personas.alice)

    answer = client.post(
        url(Tenant, "change", personas.acme.pk),
        _tenant_form(client, personas.acme, default_sort="price"),
    )

    assert answer.status_code == 302
    personas.acme.refresh_from_db()
    assert personas.acme.default_sort == "price"


KEY = {"name": "laptop", "expires_at_0": "", "expires_at_1": ""}


@pytest.mark.parametrize(
    ("allowed", "words"),
    [
        (["nosuch/model"], "unknown model 'nosuch/model'"),
        (["acme/chat-small", "acme/chat-smal"], "unknown model 'acme/chat-smal'"),
        (['["acme/chat-small"]'], "unknown model"),
    ],
)
def test_it_refuses_allowed_models_not_in_the_catalogue(
    personas: Personas, allowed: list[str], words: str
) -> None:
    app = App.objects.get(team__tenant=personas.acme, name="web")

    answer = personas.client(personas.alice).post(
        url(ApiKey, "add"), {**KEY, "app": app.pk, "allowed_models": allowed}
    )

    assert words in field_errors(answer, "allowed_models")
    assert not ApiKey.objects.filter(name="laptop").exists()


def test_allowed_models_are_chosen_from_the_catalogue(personas: Personas) -> None:
    page = personas.client(personas.alice).get(url(ApiKey, "add"))

    field = page.context["adminform"].form.fields["allowed_models"]
    assert isinstance(field.widget, forms.CheckboxSelectMultiple)
    assert [slug for slug, _ in field.choices] == sorted(
        Model.objects.values_list("slug", flat=True)
    )
    assert 'type="checkbox" name="allowed_models" value="acme/chat-small"' in (
        page.content.decode()
    )


def test_it_refuses_a_key_name_the_file_could_not_give(personas: Personas) -> None:
    app = App.objects.get(team__tenant=personas.acme, name="web")

    answer = personas.client(personas.alice).post(
        url(ApiKey, "add"), {**KEY, "name": "my laptop", "app": app.pk}
    )

    assert "slug" in field_errors(answer, "name")
    assert not ApiKey.objects.filter(app=app, name="my laptop").exists()


@pytest.mark.parametrize("allowed", [[], ["acme/chat-small", "acme/chat-large"]])
def test_it_saves_a_key_with_known_models(personas: Personas, allowed: list[str]) -> None:
    app = App.objects.get(team__tenant=personas.acme, name="web")

    answer = personas.client(personas.alice).post(
        url(ApiKey, "add"), {**KEY, "app": app.pk, "allowed_models": allowed}
    )

    assert answer.status_code == 200 and "sk-sy-" in answer.content.decode()  # the secret page
    assert ApiKey.objects.get(name="laptop").allowed_models == allowed


def test_it_shows_a_key_whose_allowed_models_were_saved_before_validation(
    personas: Personas,
) -> None:
    key = ApiKey.objects.filter(app__team__tenant=personas.acme).first()
    ApiKey.objects.filter(pk=key.pk).update(allowed_models="acme/chat-small")
    client = personas.client(personas.alice)

    page = client.get(url(ApiKey, "change", key.pk))
    fixed = client.post(
        url(ApiKey, "change", key.pk),
        {**_resubmission(page), "allowed_models": ["acme/chat-small"]},
    )

    assert page.status_code == 200
    assert fixed.status_code == 302
    key.refresh_from_db()
    assert key.allowed_models == ["acme/chat-small"]
