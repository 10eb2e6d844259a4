"""Stored responses: saved for the app that made them, found only by it, forgotten after the
retention (issue 16 item 3)."""

import asyncio
import datetime as dt
import socket
from dataclasses import replace

import pytest
from django.utils import timezone

from common import redis as sy_redis
from gateway import ledger, response_store
from gateway.ledger import ledger_drain, ledger_flush
from gateway.models import StoredResponse
from tests.gateway.test_responses_door import HOW
from tests.personas import ACME_WEB

OWNER = replace(ACME_WEB, workload="")
OTHER_APP = replace(OWNER, key_id=12, app_id=22)
CONVERSATION = [{"role": "user", "content": "hi\x00"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture(autouse=True)
def fresh_ledger_buffer(monkeypatch):
    """Each test's records only: the process's buffer keeps what it appended lately, to append
    it again after a Redis loss, and each test's Redis prefix looks like one."""
    monkeypatch.setattr(ledger, "_buffer", ledger.LedgerBuffer())


def save(id="resp_1", owner=OWNER, drain=True):
    async def saved():
        kept = await response_store.response_save(
            id=id,
            owner=owner,
            generation_id=HOW.call_id,
            model=HOW.model,
            session="resp_root",
            conversation=CONVERSATION,
            response={"id": id, "object": "response"},
        )
        if drain:
            await ledger_drain()  # the row's record is in Redis, queued for the ledger's flush
        return kept

    return in_new_loop(saved())


def turn(id="resp_1", app_id=OWNER.app_id):
    return in_new_loop(response_store.turn_find(app_id=app_id, id=id))


def in_new_loop(work):
    sy_redis._async_client = None  # the async client belongs to the loop that made it
    try:
        return asyncio.run(work)
    finally:
        sy_redis._async_client = None


def forget_hot_copy(id):
    sy_redis.sync_client().delete(sy_redis.key("response", id))


@pytest.mark.django_db(transaction=True)
def test_a_saved_turn_is_found_at_once_and_then_in_postgresql_only_by_its_app(redis_prefix):
    assert save() is True
    assert not StoredResponse.objects.exists()  # nothing written to the database on the way

    found = turn()
    assert found is not None and found.session == "resp_root"
    assert found.conversation == CONVERSATION
    assert response_store.response_find(app_id=OWNER.app_id, id="resp_1") == {
        "id": "resp_1",
        "object": "response",
    }
    assert turn(app_id=OTHER_APP.app_id) is None
    assert response_store.response_find(app_id=OTHER_APP.app_id, id="resp_1") is None

    ledger_flush()
    forget_hot_copy("resp_1")
    row = StoredResponse.objects.get(pk="resp_1")
    assert (row.tenant_id, row.app_id, row.api_key_id) == (
        OWNER.tenant_id,
        OWNER.app_id,
        OWNER.key_id,
    )
    assert row.generation_id == HOW.call_id
    found = turn()
    assert found is not None and found.conversation[0]["content"] == "hi\ufffd"  # no NUL in PG
    assert turn(app_id=OTHER_APP.app_id) is None


@pytest.mark.django_db(transaction=True)
def test_a_response_deleted_before_the_ledger_stored_it_never_comes_back(redis_prefix):
    assert save("resp_3") is True

    assert response_store.response_delete(app_id=OTHER_APP.app_id, id="resp_3") is False
    assert response_store.response_delete(app_id=OWNER.app_id, id="resp_3") is True
    ledger_flush()  # the queued row is taken, and dropped

    assert not StoredResponse.objects.exists()
    assert turn("resp_3") is None
    assert response_store.response_find(app_id=OWNER.app_id, id="resp_3") is None


@pytest.mark.django_db(transaction=True)
def test_with_redis_away_it_stores_the_row_at_once_and_says_when_that_failed(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    sy_redis._async_client = None
    sy_redis.sync_client.cache_clear()
    try:
        assert save(drain=False) is True
        assert StoredResponse.objects.filter(pk="resp_1").exists()
        assert (
            save(drain=False) is False
        )  # the same id again: the INSERT fails, the answer still goes out
    finally:
        sy_redis._async_client = None
        sy_redis.sync_client.cache_clear()


def _closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.django_db
def test_it_deletes_only_the_apps_own_response(redis_prefix):
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
    assert response_store.response_find(app_id=21, id="resp_2") == {"id": "resp_2"}
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
