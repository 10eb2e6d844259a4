"""The ledger's generation pages (SPEC H3): a record's detail names its caller, gives durations
in ms and the attempt timeline as a table (never the raw JSON); the list filters by app, key,
model, provider, status and time, and exports CSV — a tenant admin's only of their tenant."""

from __future__ import annotations

import csv
import io
from typing import Any

from django.test import Client

from gateway.models import Generation
from tenants.keys import key_hash
from tenants.models import ApiKey
from tests.personas import ACME_KEY, Personas, admin_url, generation_create

TIMELINE = {
    "route": "strategy=routing_cost",
    "explanation": ["gamma:overloaded"],
    "queue_wait_ms": 312.5,
    "degraded_from": "",
    "attempts": [
        {
            "provider": "gamma",
            "model": "acme/chat-small",
            "outcome": "overloaded",
            "queue_wait_ms": 300.0,
            "ms": 41.2,
            "next": "next_endpoint",
        },
        {
            "provider": "alpha",
            "model": "acme/chat-small",
            "outcome": "ok",
            "queue_wait_ms": 12.5,
            "ms": 388.0,
        },
    ],
}


def acme_row(personas: Personas, n: int, **fields: Any) -> Generation:
    key = ApiKey.objects.get(secret_hash=key_hash(ACME_KEY))
    return generation_create(
        personas.acme,
        n,
        app_id=key.app_id,
        team_id=key.app.team_id,
        api_key_id=key.pk,
        **fields,
    )


def test_the_detail_names_the_caller_and_shows_the_attempt_timeline(personas: Personas) -> None:
    row = acme_row(personas, 1, detail=TIMELINE, latency_ms=812.44)
    key = ApiKey.objects.get(pk=row.api_key_id)

    page = personas.client(personas.alice).get(admin_url(Generation, "change", row.pk))

    html = page.content.decode()
    assert page.status_code == 200
    fields = page.context["adminform"].form.fields
    assert "detail" not in fields and "detail" not in page.context["adminform"].readonly_fields
    for shown in ("acme", key.app.team.name, key.app.name, f"{key.prefix}…", "812.4", "312.5"):
        assert shown in html, shown
    assert '<table class="attempt-timeline">' in html
    assert "<td>gamma</td><td>acme/chat-small</td><td>overloaded</td>" in html
    assert "next endpoint" in html and "388.0" in html
    assert "&quot;attempts&quot;" not in html and '"attempts"' not in html


def test_a_record_from_before_the_timeline_still_shows(personas: Personas) -> None:
    row = acme_row(personas, 2, detail={"explanation": ["beta:capacity"], "route": ""})

    page = personas.client(personas.staff).get(admin_url(Generation, "change", row.pk))

    assert page.status_code == 200
    assert "passed over: beta:capacity" in page.content.decode()


def listed(client: Client, **params: Any) -> set[str]:
    page = client.get(admin_url(Generation, "changelist"), params)
    assert page.status_code == 200
    return {row.id for row in page.context["cl"].result_list}


def test_the_list_filters_by_app_key_model_provider_status_and_time(personas: Personas) -> None:
    client = personas.client(personas.alice)
    key = ApiKey.objects.get(secret_hash=key_hash(ACME_KEY))
    mine = acme_row(personas, 1)
    other_app = generation_create(personas.acme, 2, app_id=0, api_key_id=0, provider="beta")
    failed = acme_row(personas, 3, status=502, model="acme/chat-small")

    assert listed(client, app=key.app_id) == {mine.id, failed.id}
    assert listed(client, key=key.pk) == {mine.id, failed.id}
    assert listed(client, model="acme/chat-small") == {failed.id}
    assert listed(client, provider="beta") == {other_app.id}
    assert listed(client, status_class="5xx") == {failed.id}
    window = {
        "created_at__gte": "2030-01-01 00:01:30+00:00",
        "created_at__lt": "2030-01-02 00:00:00+00:00",
    }
    assert listed(client, **window) == {other_app.id, failed.id}


def test_a_member_filters_only_by_their_own_apps_and_keys(personas: Personas) -> None:
    acme_row(personas, 1)

    page = personas.client(personas.alice).get(admin_url(Generation, "changelist"))

    html = page.content.decode()
    globex_keys = ApiKey.objects.filter(app__team__tenant=personas.globex)
    assert globex_keys and not [k for k in globex_keys if f"?key={k.pk}" in html]
    assert "globex/" not in html


def test_csv_export_has_the_callers_names_and_only_the_members_tenant(
    personas: Personas,
) -> None:
    mine = acme_row(personas, 1, detail=TIMELINE)
    theirs = generation_create(personas.globex, 2)
    key = ApiKey.objects.get(pk=mine.api_key_id)

    answer = personas.client(personas.alice).post(
        admin_url(Generation, "changelist"),
        {"action": "export_csv", "_selected_action": [mine.pk, theirs.pk]},
    )

    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    assert [r["id"] for r in rows] == [mine.id]
    [row] = rows
    assert (row["tenant"], row["app"], row["key_prefix"]) == ("acme", key.app.name, key.prefix)
    assert (row["latency_ms"], row["queue_wait_ms"], row["status"]) == ("812.4", "312.5", "200")
