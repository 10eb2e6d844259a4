"""The tenant activity page (SPEC G15, H3): a tenant's recent requests, newest first."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from gateway.selectors import Cursor, generation_list
from tenants.keys import key_hash
from tenants.models import ApiKey, App
from tests.personas import ACME_KEY, Personas, generation_create


def activity(tenant: str) -> str:
    return reverse("ops:tenant-activity", args=[tenant])


def ids(page: Any) -> list[str]:
    return [row.id for row in page.context["rows"]]


@pytest.fixture
def ledger(personas: Personas) -> None:
    generation_create(personas.acme, 1)
    generation_create(personas.acme, 2, model="acme/chat-small", provider="gamma")
    generation_create(personas.acme, 3, status=429, reason_code="tenant:acme:requests:1m")
    generation_create(personas.acme, 4, status=502, provider="beta", reason_code="upstream_error")
    generation_create(personas.globex, 1, reason_code="globex-only")


def test_it_lists_a_tenants_requests_newest_first(personas: Personas, ledger: None) -> None:
    page = personas.client(personas.alice).get(activity("acme"))

    assert page.status_code == 200
    assert ids(page) == ["gen-acme-0004", "gen-acme-0003", "gen-acme-0002", "gen-acme-0001"]
    html = page.content.decode()
    for shown in ("acme/chat-small", "gamma", "429", "tenant:acme:requests:1m", "0.000123", "812"):
        assert shown in html
    assert "globex" not in html


def test_it_shows_another_tenants_page_exactly_like_a_missing_one(
    personas: Personas, ledger: None
) -> None:
    client = personas.client(personas.carol)

    foreign = client.get(activity("acme"))
    missing = client.get(activity("nobody"))

    assert foreign.status_code == missing.status_code == 404
    assert foreign.content == missing.content
    assert b"gen-acme" not in foreign.content


def test_platform_staff_see_every_tenants_page(personas: Personas, ledger: None) -> None:
    client = personas.client(personas.staff)

    assert ids(client.get(activity("globex"))) == ["gen-globex-0001"]
    assert len(ids(client.get(activity("acme")))) == 4


def test_both_members_of_a_tenant_see_its_page(personas: Personas, ledger: None) -> None:
    for user in (personas.alice, personas.bob):
        assert len(ids(personas.client(user).get(activity("acme")))) == 4


def test_it_sends_a_visitor_to_the_admin_login(personas: Personas) -> None:
    page = Client().get(activity("acme"))

    assert page.status_code == 302 and reverse("admin:login") in page["Location"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"model": "acme/chat-small"}, ["gen-acme-0002"]),
        ({"provider": "beta"}, ["gen-acme-0004"]),
        ({"status": "429"}, ["gen-acme-0003"]),
        ({"status": "ok"}, ["gen-acme-0002", "gen-acme-0001"]),
        ({"status": "4xx"}, ["gen-acme-0003"]),
        ({"status": "5xx"}, ["gen-acme-0004"]),
        ({"model": "acme/chat-large", "provider": "alpha"}, ["gen-acme-0003", "gen-acme-0001"]),
        (
            {"model": "no/such-model"},
            ["gen-acme-0004", "gen-acme-0003", "gen-acme-0002", "gen-acme-0001"],
        ),
    ],
)
def test_it_filters_by_model_provider_and_status(
    personas: Personas, ledger: None, query: dict[str, str], expected: list[str]
) -> None:
    page = personas.client(personas.alice).get(activity("acme"), query)

    assert ids(page) == expected


def test_it_pages_by_keyset_without_gaps_or_repeats(personas: Personas) -> None:
    for minute in range(60):  # two requests in each minute: ties broken by id
        for suffix in ("a", "b"):
            generation_create(personas.acme, minute, id=f"gen-acme-{minute:04d}-{suffix}")
    client = personas.client(personas.alice)
    pages: list[list[str]] = []

    page = client.get(activity("acme"), {"status": "ok"})
    while True:
        pages.append(ids(page))
        if page.context["next_url"] is None:
            break
        page = client.get(activity("acme") + page.context["next_url"])
        assert page.context["first_url"] == "?status=ok"

    assert [len(p) for p in pages] == [50, 50, 20]
    expected = [f"gen-acme-{m:04d}-{s}" for m in reversed(range(60)) for s in ("b", "a")]
    assert [i for p in pages for i in p] == expected


def test_a_cursor_survives_its_round_trip() -> None:
    cursor = Cursor(created_at=datetime(2030, 1, 1, 12, 30, 5, 123456, tzinfo=UTC), id="gen-x")

    assert Cursor.decode(cursor.encode()) == cursor
    assert Cursor.decode("garbage") is None
    assert Cursor.decode("2030-01-01T00:00:00~gen-x") is None  # no time zone


def test_the_selector_reads_only_the_given_tenant(personas: Personas, ledger: None) -> None:
    page = generation_list(tenant_id=personas.globex.pk, limit=10)

    assert [row.id for row in page.rows] == ["gen-globex-0001"] and page.next is None


def test_the_tenant_admin_links_to_the_activity_page(personas: Personas) -> None:
    client = personas.client(personas.alice)
    tenant_page = client.get(reverse("admin:tenants_tenant_change", args=[personas.acme.pk]))
    listing = client.get(reverse("admin:tenants_tenant_changelist"))

    assert activity("acme") in tenant_page.content.decode()
    assert activity("acme") in listing.content.decode()


def test_the_page_leaves_room_for_more_tabs(personas: Personas) -> None:
    page = personas.client(personas.alice).get(activity("acme"))

    activity_tab, saturation_tab = page.context["tabs"]
    assert (activity_tab.label, activity_tab.url, activity_tab.active) == (
        "Activity",
        activity("acme"),
        True,
    )
    assert (saturation_tab.label, saturation_tab.active) == ("Saturation", False)
    assert saturation_tab.url == reverse("ops:tenant-saturation", args=["acme"])
    assert 'class="ops-tabs"' in page.content.decode()


def _web_key_row(personas: Personas, n: int, **fields: Any) -> Any:
    key = ApiKey.objects.get(secret_hash=key_hash(ACME_KEY))
    return generation_create(personas.acme, n, app_id=key.app_id, api_key_id=key.pk, **fields)


def test_it_filters_by_app_key_and_time_range(personas: Personas, ledger: None) -> None:
    key = ApiKey.objects.get(secret_hash=key_hash(ACME_KEY))
    _web_key_row(personas, 5, id="gen-acme-web-5")
    _web_key_row(personas, 9, id="gen-acme-web-9")
    client = personas.client(personas.alice)

    by_key = client.get(activity("acme"), {"key": key.pk})
    by_app = client.get(activity("acme"), {"app": key.app_id})
    window = client.get(
        activity("acme"), {"since": "2030-01-01T00:03", "until": "2030-01-01T00:09"}
    )

    assert ids(by_key) == ["gen-acme-web-9", "gen-acme-web-5"]
    assert set(ids(by_key)) <= set(ids(by_app))
    assert ids(window) == ["gen-acme-web-5", "gen-acme-0004", "gen-acme-0003"]
    assert window.context["csv_url"].startswith("?since=2030-01-01T00%3A03&until=")


def test_it_offers_only_the_tenants_own_apps_and_keys(personas: Personas, ledger: None) -> None:
    page = personas.client(personas.alice).get(activity("acme"))

    form = page.context["form"]
    apps = {value for value, _ in form.fields["app"].choices if value}
    keys = {value for value, _ in form.fields["key"].choices if value}
    assert apps == set(App.objects.filter(team__tenant=personas.acme).values_list("pk", flat=True))
    assert keys == set(
        ApiKey.objects.filter(app__team__tenant=personas.acme).values_list("pk", flat=True)
    )
    globex_key = ApiKey.objects.filter(app__team__tenant=personas.globex).first()
    foreign = personas.client(personas.alice).get(activity("acme"), {"key": globex_key.pk})
    assert foreign.context["form"].errors  # not one of acme's: refused, and ignored


def test_it_exports_the_filtered_requests_as_csv(personas: Personas, ledger: None) -> None:
    key = ApiKey.objects.get(secret_hash=key_hash(ACME_KEY))
    _web_key_row(personas, 5, id="gen-acme-web-5", status=429)

    answer = personas.client(personas.alice).get(
        activity("acme"), {"status": "4xx", "format": "csv"}
    )

    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    assert "acme-activity.csv" in answer["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    assert [r["id"] for r in rows] == ["gen-acme-web-5", "gen-acme-0003"]
    assert (rows[0]["app"], rows[0]["key_prefix"], rows[0]["status"]) == (
        key.app.name,
        key.prefix,
        "429",
    )
    assert {r["tenant"] for r in rows} == {"acme"}


def test_another_tenants_csv_is_a_404(personas: Personas, ledger: None) -> None:
    answer = personas.client(personas.carol).get(activity("acme"), {"format": "csv"})

    assert answer.status_code == 404
