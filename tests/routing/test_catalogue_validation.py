"""The catalogue admin refuses what ``loadconfig`` refuses: negative prices, sizes of 0, unknown
features or a string of them (read letter by letter), a cache TTL of 0 or less."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from routing.models import Endpoint, Model, Provider
from tests.personas import Personas, field_errors, personas_create, redis_prefix_scope
from tests.personas import admin_url as url


@pytest.fixture
def personas(db: None, settings: Any) -> Iterator[Personas]:
    for _prefix in redis_prefix_scope(settings):
        yield personas_create()


@pytest.fixture
def staff(personas: Personas) -> Client:
    return personas.client(personas.staff)


def endpoint_form(**fields: str) -> dict[str, str]:
    model = Model.objects.create(slug="test/new-model")
    return {
        "model": str(model.pk),
        "provider": str(Provider.objects.get(name="alpha").pk),
        "upstream_model": "new-model",
        "position": "0",
        "price_input": "0.5",
        "price_cached_input": "0.05",
        "price_output": "1.5",
        "context_window": "128000",
        "max_output": "4096",
        "supports": '["tools", "stream"]',
        "quality_note": "",
        "batch_discount": "0.5",
        "batch_turnaround_seconds": "86400",
        "is_active": "on",
        **fields,
    }


BAD_ENDPOINTS = {
    "negative input price": ("price_input", "-1", "zero or a positive"),
    "negative cached price": ("price_cached_input", "-0.01", "zero or a positive"),
    "negative output price": ("price_output", "-2", "zero or a positive"),
    "context window 0": ("context_window", "0", "positive whole number"),
    "max output 0": ("max_output", "0", "positive whole number"),
    "max output beyond the context": ("max_output", "200000", "must not exceed context_window"),
    "features as a string": ("supports", '"tools"', "must be a list"),
    "unknown feature": ("supports", '["tools", "teleport"]', "[1]: must be one of tools"),
    "region not a tag": ("region", "Europe West", "must be a region tag"),
    "batch discount of all": ("batch_discount", "1", "must be a share from 0 to below 1"),
    "batch turnaround 0": ("batch_turnaround_seconds", "0", "positive whole number"),
}


@pytest.mark.parametrize(
    ("field", "value", "words"), BAD_ENDPOINTS.values(), ids=list(BAD_ENDPOINTS)
)
def test_it_refuses_an_endpoint_loadconfig_refuses(
    staff: Client, field: str, value: str, words: str
) -> None:
    count = Endpoint.objects.count()

    answer = staff.post(url(Endpoint, "add"), endpoint_form(**{field: value}))

    assert words in field_errors(answer, field)
    assert Endpoint.objects.count() == count


def test_it_saves_a_good_endpoint(staff: Client) -> None:
    answer = staff.post(url(Endpoint, "add"), endpoint_form(price_input="0", supports="[]"))

    assert answer.status_code == 302
    endpoint = Endpoint.objects.get(model__slug="test/new-model")
    assert (endpoint.price_input, endpoint.supports) == (0, [])


PROVIDER = {
    "name": "delta",
    "protocol": "openai",
    "base_url": "https://delta.example/v1",
    "api_key": "",
    "cache_ttl_seconds": "300",
    "learn_concurrency": "on",
    "is_active": "on",
    # the provider page's inlines: its projects and its pool of keys (none here)
    "projects-TOTAL_FORMS": "0",
    "projects-INITIAL_FORMS": "0",
    "credentials-TOTAL_FORMS": "0",
    "credentials-INITIAL_FORMS": "0",
}


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("cache_ttl_seconds", "-10", "positive"),
        ("cache_ttl_seconds", "0", "positive"),
        ("base_url", "ftp://delta.example/v1", "http(s) URL"),
    ],
)
def test_it_refuses_a_provider_loadconfig_refuses(
    staff: Client, field: str, value: str, words: str
) -> None:
    answer = staff.post(url(Provider, "add"), {**PROVIDER, field: value})

    assert words in field_errors(answer, field)
    assert not Provider.objects.filter(name="delta").exists()


def test_it_saves_a_good_provider(staff: Client) -> None:
    answer = staff.post(url(Provider, "add"), {**PROVIDER, "cache_ttl_seconds": "0.5"})

    assert answer.status_code == 302
    assert Provider.objects.get(name="delta").cache_ttl_seconds == 0.5


MODEL = {
    "slug": "test/new-model",
    "default_output_tokens": "400",
    "default_input_tokens": "",
    "max_cost_premium": "0.06",
    "allow_fallbacks": "on",
    "routing_parameters": "{}",
    "is_active": "on",
    "endpoints-TOTAL_FORMS": "0",
    "endpoints-INITIAL_FORMS": "0",
}


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("default_output_tokens", "0", "positive whole number"),
        ("default_input_tokens", "0", "positive whole number"),
        ("max_cost_premium", "-0.01", "zero or a positive number"),
        ("routing_parameters", '{"band": true}', "must be a number"),
        ("routing_parameters", '{"bandd": 0.2}', "known:"),
        ("slug", "test/new model", "model id"),
        ("fallback_contract", '{"regions": "eu"}', "must be 'same' or a list"),
        ("fallback_contract", '{"max_price_ratio": 0.5}', "must be a number >= 1"),
        ("fallback_contract", '{"region": "same"}', "unknown clause 'region'"),
    ],
)
def test_it_refuses_a_model_loadconfig_refuses(
    staff: Client, field: str, value: str, words: str
) -> None:
    answer = staff.post(url(Model, "add"), {**MODEL, field: value})

    assert words in field_errors(answer, field)
    assert not Model.objects.filter(slug__startswith="test/new").exists()


def test_it_saves_a_good_model(staff: Client) -> None:
    contract = '{"regions": "same", "max_price_ratio": 1.5}'
    answer = staff.post(
        url(Model, "add"),
        {**MODEL, "routing_parameters": '{"band": 0.2}', "fallback_contract": contract},
    )

    assert answer.status_code == 302
    saved = Model.objects.get(slug="test/new-model")
    assert saved.routing_parameters == {"band": 0.2}
    assert saved.fallback_contract == {"regions": "same", "max_price_ratio": 1.5}
    assert saved.max_cost_premium == Decimal("0.06")


def test_an_empty_cost_guard_bound_is_the_default_guards(staff: Client) -> None:
    answer = staff.post(url(Model, "add"), {**MODEL, "max_cost_premium": ""})

    assert answer.status_code == 302
    assert Model.objects.get(slug="test/new-model").max_cost_premium is None


def test_an_emptied_fallback_contract_is_no_contract(staff: Client) -> None:
    answer = staff.post(url(Model, "add"), {**MODEL, "fallback_contract": ""})

    assert answer.status_code == 302
    assert Model.objects.get(slug="test/new-model").fallback_contract == {}


def test_it_shows_an_endpoint_saved_before_validation(personas: Personas, staff: Client) -> None:
    endpoint = Endpoint.objects.first()
    Endpoint.objects.filter(pk=endpoint.pk).update(supports="tools", context_window=0)

    page = staff.get(url(Endpoint, "change", endpoint.pk))
    listing = staff.get(url(Endpoint, "changelist"))
    model_page = staff.get(url(Model, "change", endpoint.model_id))

    assert page.status_code == listing.status_code == model_page.status_code == 200
