"""The bucket form asks for the one scope a limit applies to (a plain select of that kind's
objects, the reader's own for a tenant admin), and a bucket's page shows its live level from
the broker's Redis store — or says Redis did not answer, instead of failing."""

from __future__ import annotations

from typing import Any

from django import forms
from django.test import Client

from quotas.core.model import Usage
from quotas.models import Bucket
from tenants.models import App
from tests.ops.test_saturation_page import reserve
from tests.personas import Personas, admin_url
from tests.stack import free_port

CONCURRENCY = "app:acme/search/web:concurrency"


def scope_fields(page: Any) -> list[str]:
    fields = page.context["adminform"].form.fields
    return [name for name in ("scope_kind", *Bucket.SCOPE_FIELDS) if name in fields]


def test_the_add_page_asks_for_the_kind_first(personas: Personas) -> None:
    page = personas.client(personas.staff).get(admin_url(Bucket, "add"))

    assert scope_fields(page) == ["scope_kind"]
    html = page.content.decode()
    for kind in Bucket.SCOPE_FIELDS:
        assert f'href="?scope_kind={kind}"' in html


def test_then_it_asks_for_one_scope_of_that_kind_in_a_plain_select(personas: Personas) -> None:
    page = personas.client(personas.alice).get(admin_url(Bucket, "add"), {"scope_kind": "app"})

    assert scope_fields(page) == ["scope_kind", "app"]
    field = page.context["adminform"].form.fields["app"]
    assert type(field.widget.widget if hasattr(field.widget, "widget") else field.widget) is (
        forms.Select
    )
    assert set(field.queryset) == set(App.objects.filter(team__tenant=personas.acme))
    assert page.context["adminform"].form.initial["scope_kind"] == "app"


def test_a_member_is_not_asked_for_a_scope_above_their_teams(personas: Personas) -> None:
    client = personas.client(personas.alice)

    page = client.get(admin_url(Bucket, "add"), {"scope_kind": "tenant"})

    assert scope_fields(page) == ["scope_kind"]
    assert 'href="?scope_kind=tenant"' not in page.content.decode()


def test_a_buckets_page_shows_its_one_scope_read_only(personas: Personas) -> None:
    bucket = Bucket.objects.get(name=CONCURRENCY)

    page = personas.client(personas.staff).get(admin_url(Bucket, "change", bucket.pk))

    readonly = page.context["adminform"].readonly_fields
    assert "scope_kind" in readonly and "app" in readonly
    assert [f for f in scope_fields(page) if f not in readonly] == []
    shown = [f for line in page.context["adminform"] for f in line.fields]
    assert "app" in shown and "team" not in shown and "tenant" not in shown


def live_level(client: Client, bucket: Bucket) -> str:
    page = client.get(admin_url(Bucket, "change", bucket.pk))
    assert page.status_code == 200
    [text] = [
        field.contents()
        for fieldset in page.context["adminform"]
        for line in fieldset
        for field in line
        if field.is_readonly and field.field["name"] == "live_level"
    ]
    return str(text)


def test_a_buckets_page_shows_its_live_level(personas: Personas) -> None:
    bucket = Bucket.objects.get(name=CONCURRENCY)
    reserve([CONCURRENCY], Usage(requests=1, concurrency=5))

    text = live_level(personas.client(personas.alice), bucket)

    capacity = int(bucket.capacity or 0)
    assert text.startswith(f"{capacity - 5} of {capacity} concurrent requests available"), text
    assert f"({500 / capacity:g} % used)" in text


def test_it_says_so_when_redis_is_down(personas: Personas, settings: Any) -> None:
    bucket = Bucket.objects.get(name=CONCURRENCY)
    client = personas.client(personas.staff)
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there

    text = live_level(client, bucket)

    assert text.startswith("Live level unavailable: Redis did not answer"), text
