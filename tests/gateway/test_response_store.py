"""Stored responses: saved for the app that made them, found only by it, forgotten after the
retention (issue 16 item 3)."""

import asyncio
import datetime as dt
from dataclasses import replace

import pytest
from django.utils import timezone

from gateway import response_store
from gateway.models import StoredResponse
from tenants.identity import Principal
from tests.gateway.test_responses_door import HOW

OWNER = Principal(
    key_id=11,
    key_name="k",
    key_prefix="sk-sy-t",
    app_id=21,
    app_name="web",
    environment="prod",
    team_id=31,
    team_name="t",
    tenant_id=41,
    tenant_name="acme",
    tenant_weight=1.0,
    tenant_default_sort="",
    partner_id=None,
    partner_name=None,
    workload="",
    allowed_models=None,
    expires_at=None,
    revoked=False,
)
OTHER_APP = replace(OWNER, key_id=12, app_id=22)
CONVERSATION = [{"role": "user", "content": "hi\x00"}, {"role": "assistant", "content": "hello"}]


def save(id="resp_1", owner=OWNER):
    return asyncio.run(
        response_store.response_save(
            id=id,
            owner=owner,
            generation_id=HOW.call_id,
            model=HOW.model,
            session="resp_root",
            conversation=CONVERSATION,
            response={"id": id, "object": "response"},
        )
    )


@pytest.mark.django_db(transaction=True)
def test_it_finds_a_saved_turn_only_for_the_app_that_made_it():
    assert save() is True

    turn = asyncio.run(response_store.turn_find(app_id=OWNER.app_id, id="resp_1"))
    assert turn is not None and turn.session == "resp_root"
    assert turn.conversation[0]["content"] == "hi\ufffd"  # PostgreSQL keeps no NUL
    assert asyncio.run(response_store.turn_find(app_id=OTHER_APP.app_id, id="resp_1")) is None
    row = StoredResponse.objects.get(pk="resp_1")
    assert (row.tenant_id, row.app_id, row.api_key_id) == (41, 21, 11)
    assert row.generation_id == HOW.call_id


@pytest.mark.django_db(transaction=True)
def test_it_says_when_the_database_refused_the_answer():
    assert save() is True
    assert save() is False  # the same id again: the INSERT fails, the answer still goes out


@pytest.mark.django_db
def test_it_deletes_only_the_apps_own_response():
    StoredResponse.objects.create(
        id="resp_2",
        tenant_id=41,
        app_id=21,
        api_key_id=11,
        generation_id="gen-2",
        model="m",
        conversation=[],
        response={"id": "resp_2"},
    )

    assert response_store.response_find(app_id=22, id="resp_2") is None
    assert response_store.response_delete(app_id=22, id="resp_2") is False
    assert response_store.response_find(app_id=21, id="resp_2").response == {"id": "resp_2"}
    assert response_store.response_delete(app_id=21, id="resp_2") is True
    assert not StoredResponse.objects.exists()


@pytest.mark.django_db
def test_it_forgets_responses_past_their_retention(settings):
    settings.RESPONSE_RETENTION_SECONDS = 3600
    now = timezone.now()
    for id, age in (("resp_old", 3601), ("resp_new", 3599)):
        StoredResponse.objects.create(
            id=id,
            created_at=now - dt.timedelta(seconds=age),
            tenant_id=1,
            app_id=1,
            api_key_id=1,
            generation_id="gen",
            model="m",
            conversation=[],
            response={},
        )

    assert response_store.responses_forget(now) == 1
    assert list(StoredResponse.objects.values_list("pk", flat=True)) == ["resp_new"]
