"""``GET /v1/generation?id=gen-…`` (SPEC G15): the caller's own record, in OpenRouter's shape.

"Own" is the caller's app: another app's record, of the same tenant or another, looks missing.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from django.utils import timezone

from common import redis as gateway_redis
from gateway.models import Generation
from gateway.snapshot import holder
from tenants.models import ApiKey, App
from tests.personas import (
    ACME_KEY,
    GLOBEX_KEY,
    Personas,
    generation_create,
)
from tests.stack import wait_until

URL = "/v1/generation"
INDEXER_KEY = "sk-sy-test-acme-indexer-0001"  # another app (indexer) of ACME_KEY's team


def web_row(personas: Personas, n: int, **fields: Any) -> Generation:
    """A record of acme's ``web`` app, the app of ACME_KEY."""
    web = App.objects.get(team__tenant=personas.acme, name="web")
    return generation_create(personas.acme, n, app_id=web.pk, **fields)


def get(key: str | None, **params: str) -> Any:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return Client().get(URL, params, headers=headers)


def test_it_returns_the_callers_own_generation(personas: Personas) -> None:
    row = web_row(personas, 7, reason_code="", streamed=True)

    answer = get(ACME_KEY, id=row.id)

    assert answer.status_code == 200
    data = answer.json()["data"]
    assert data["id"] == row.id
    assert (data["model"], data["provider_name"], data["upstream_model"]) == (
        "acme/chat-large",
        "alpha",
        "chat-large",
    )
    assert (data["tokens_prompt"], data["tokens_completion"], data["native_tokens_cached"]) == (
        107,
        20,
        5,
    )
    assert data["total_cost"] == pytest.approx(0.000123)
    assert (data["latency"], data["time_to_first_token"]) == (812, 141)
    assert (data["finish_reason"], data["streamed"], data["cancelled"]) == ("stop", True, False)
    assert (data["status"], data["reason_code"], data["workload_class"]) == (
        200,
        None,
        "interactive",
    )
    assert data["created_at"].startswith("2030-01-01T00:07:00")
    # ?format= is no override of ours: the record, as JSON, all the same.
    assert get(ACME_KEY, id=row.id, format="api").json()["data"]["id"] == row.id


def test_it_answers_another_tenants_generation_exactly_like_a_missing_one(
    personas: Personas,
) -> None:
    row = web_row(personas, 1)
    generation_create(personas.globex, 1)

    foreign = get(GLOBEX_KEY, id=row.id)
    missing = get(GLOBEX_KEY, id="gen-acme-9999")

    assert foreign.status_code == missing.status_code == 404
    expected = missing.json()  # the same envelope, naming the id the caller asked for
    expected["error"]["message"] = expected["error"]["message"].replace("gen-acme-9999", row.id)
    assert foreign.json() == expected
    assert expected["error"]["code"] == "not_found"


def test_it_answers_another_apps_generation_of_the_same_tenant_exactly_like_a_missing_one(
    personas: Personas,
) -> None:
    indexer = App.objects.get(team__tenant=personas.acme, name="indexer")
    row = generation_create(personas.acme, 1, app_id=indexer.pk)

    foreign = get(ACME_KEY, id=row.id)
    missing = get(ACME_KEY, id="gen-acme-9999")

    assert get(INDEXER_KEY, id=row.id).status_code == 200  # its own app reads it
    assert foreign.status_code == missing.status_code == 404
    expected = missing.json()
    expected["error"]["message"] = expected["error"]["message"].replace("gen-acme-9999", row.id)
    assert foreign.json() == expected


def test_it_answers_a_record_without_an_app_like_a_missing_one(personas: Personas) -> None:
    row = generation_create(personas.acme, 1, app_id=None)

    assert get(ACME_KEY, id=row.id).status_code == 404


def test_it_answers_404_until_the_record_is_flushed(personas: Personas) -> None:
    answer = get(ACME_KEY, id="gen-0123456789abcdef0123456789abcdef")

    assert answer.status_code == 404
    assert "a few seconds" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    "params",
    [{}, {"id": ""}, {"id": "chatcmpl-1"}, {"id": "gen-" + "a" * 60}, {"id": "gen-1' or '1'='1"}],
)
def test_it_refuses_a_missing_or_malformed_id(personas: Personas, params: dict[str, str]) -> None:
    answer = get(ACME_KEY, **params)

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "id")


def test_it_takes_the_key_as_anthropics_clients_send_it(personas: Personas) -> None:
    row = web_row(personas, 3)

    answer = Client().get(URL, {"id": row.id}, headers={"x-api-key": ACME_KEY})
    wrong = Client().get(URL, {"id": row.id}, headers={"x-api-key": ACME_KEY + "x"})

    assert answer.status_code == 200
    assert answer.json()["data"]["id"] == row.id
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    "key", [None, "sk-sy-test-nobody-000000", "not-a-key", "sk-sy-test-acme-indexer-0001x"]
)
def test_it_refuses_a_missing_or_unknown_key(personas: Personas, key: str | None) -> None:
    row = web_row(personas, 1)

    answer = get(key, id=row.id)

    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "invalid_api_key"


def test_it_refuses_a_revoked_key_once_the_configuration_moves(personas: Personas) -> None:
    row = web_row(personas, 1)
    assert get(ACME_KEY, id=row.id).status_code == 200

    ApiKey.objects.filter(name="ci", app__name="web").update(revoked_at=timezone.now())
    gateway_redis.config_version_bump()

    assert get(ACME_KEY, id=row.id).status_code == 401


def test_it_identifies_the_key_without_a_database_query(
    personas: Personas, django_assert_num_queries: Any
) -> None:
    row = web_row(personas, 1)
    get(ACME_KEY, id=row.id)  # the first call of a configuration version builds the index

    with django_assert_num_queries(1):  # the generation itself
        assert get(ACME_KEY, id=row.id).status_code == 200


def test_it_answers_other_methods_with_the_envelope(personas: Personas) -> None:
    answer = Client().post(URL, headers={"authorization": f"Bearer {ACME_KEY}"})

    assert answer.status_code == 405
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_it_shares_the_proxy_snapshot_when_served_by_asgi(
    personas: Personas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ASGI the key index comes from the proxy's snapshot holder, on the server's loop."""
    row = web_row(personas, 1)
    # This test's event loop owns a fresh async Redis client, closed again before it ends.
    monkeypatch.setattr(gateway_redis, "_async_client", None)
    holder.reset()

    async def scenario() -> tuple[int, int, bool]:
        try:
            client = AsyncClient()
            own = await client.get(
                URL, {"id": row.id}, headers={"authorization": f"Bearer {ACME_KEY}"}
            )
            foreign = await client.get(
                URL, {"id": row.id}, headers={"authorization": f"Bearer {GLOBEX_KEY}"}
            )
            shared = holder._snapshot is not None
            return own.status_code, foreign.status_code, shared
        finally:
            await gateway_redis.async_client().aclose()

    try:
        # async_to_sync, not asyncio.run: the view's thread-sensitive code then runs in this
        # thread, on the test's database connection and transaction.
        assert async_to_sync(scenario)() == (200, 404, True)
    finally:
        holder.reset()


@pytest.mark.e2e
def test_it_finds_a_proxied_request_a_moment_after_it_finishes(stack: Any) -> None:
    """Through uvicorn: the middleware-free proxy handler, the Celery flush, the ASGI key path."""
    auth = {"Authorization": f"Bearer {ACME_KEY}"}
    response = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers=auth,
        json={"model": "acme/chat-small", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert response.status_code == 200
    body = response.json()

    def lookup(key: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.get(f"{stack.base_url}{URL}", params={"id": body["id"]}, headers=headers)

    wait_until(lambda: lookup(ACME_KEY).status_code == 200, timeout=15, what="the ledger row")
    data = lookup(ACME_KEY).json()["data"]
    assert (data["id"], data["model"], data["provider_name"]) == (
        body["id"],
        "acme/chat-small",
        response.headers["x-switchyard-provider"],
    )
    assert (data["tokens_prompt"], data["tokens_completion"]) == (
        body["usage"]["prompt_tokens"],
        body["usage"]["completion_tokens"],
    )
    assert data["total_cost"] == pytest.approx(body["usage"]["cost"], rel=1e-6)
    assert lookup(GLOBEX_KEY).status_code == 404
