"""``POST /v1/embeddings`` and model aliases with the official ``openai`` SDK, through the gateway
to the provider simulator (issue 16 items 4 and 5): real gateway, simulator, Redis, PostgreSQL
and Celery (the ledger)."""

from __future__ import annotations

import base64
import math
import os
import struct

import httpx
import openai
import pytest

from quotas.allowances import IDLE_AFTER
from simulator.model import count_text_tokens
from simulator.server.embeddings import embedding_vector
from tests.e2e.brokerstate import bucket_available
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"
MODEL = "acme/embed-small"  # alpha's embed-small: 1536 dimensions (config/market.yaml)
TEXT = "Switchyard routes every door through one spine."


@pytest.fixture
def client(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=KEY, max_retries=0)


def norm(vector) -> float:
    return math.sqrt(sum(x * x for x in vector))


def test_one_string_embeds_to_the_simulators_vector_with_its_usage(client):
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=TEXT)
    answer = raw.parse()

    assert answer.object == "list" and answer.model == MODEL
    [item] = answer.data
    # The SDK asked for base64 (its default) and decoded the float32s.
    assert len(item.embedding) == 1536 and norm(item.embedding) == pytest.approx(1.0, abs=1e-5)
    assert item.embedding == pytest.approx(embedding_vector(TEXT, 1536), abs=1e-6)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == count_text_tokens(TEXT)
    assert raw.headers["x-switchyard-provider"] == "alpha"
    assert raw.headers["x-switchyard-reason"] == "ok"
    assert answer.model_extra["provider"] == "alpha"
    assert answer.usage.model_extra["cost"] == pytest.approx(count_text_tokens(TEXT) * 0.02 / 1e6)


def test_a_batch_keeps_its_order_and_counts_every_input(client):
    texts = ["first input", "the second, a little longer", "third"]
    answer = client.embeddings.create(model=MODEL, input=texts)

    assert [item.index for item in answer.data] == [0, 1, 2]
    for text, item in zip(texts, answer.data, strict=True):
        assert item.embedding == pytest.approx(embedding_vector(text, 1536), abs=1e-6)
    assert answer.usage.prompt_tokens == sum(count_text_tokens(t) for t in texts)


def test_token_arrays_are_counted_exactly(client):
    answer = client.embeddings.create(model=MODEL, input=[[101, 2023, 2003], [7592, 102]])
    assert len(answer.data) == 2 and answer.usage.prompt_tokens == 5


def test_dimensions_shortens_the_vectors(client):
    answer = client.embeddings.create(model=MODEL, input=["a", "b"], dimensions=256)
    assert [len(item.embedding) for item in answer.data] == [256, 256]
    assert norm(answer.data[0].embedding) == pytest.approx(1.0, abs=1e-5)


def test_base64_asked_for_comes_back_as_little_endian_float32(client):
    answer = client.embeddings.create(
        model=MODEL, input=TEXT, dimensions=64, encoding_format="base64"
    )
    encoded = answer.data[0].embedding
    assert isinstance(encoded, str)
    floats = struct.unpack("<64f", base64.b64decode(encoded))
    assert floats == pytest.approx(embedding_vector(TEXT, 64), abs=1e-6)


def test_float_asked_for_comes_back_as_json_numbers(stack):
    answer = httpx.post(
        f"{stack.base_url}/v1/embeddings",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": MODEL, "input": TEXT, "dimensions": 8, "encoding_format": "float"},
        timeout=30,
    )
    assert answer.status_code == 200
    assert answer.json()["data"][0]["embedding"] == pytest.approx(embedding_vector(TEXT, 8))


def test_usage_reconciles_exactly_in_the_ledger(stack, client):
    texts = ["ledger this input", "and this one, please"]
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=texts, user="e2e-emb")
    answer = raw.parse()
    generation = raw.headers["x-request-id"]
    expected = sum(count_text_tokens(t) for t in texts)  # the simulator's own count
    assert answer.usage.prompt_tokens == expected

    def rows():
        return stack.sql(
            "select g.model, g.provider, g.status, g.input_tokens, g.output_tokens,"
            " g.estimated_output_tokens, g.detail->>'door', r.outcome, r.estimated_output_tokens,"
            " r.actual_input_tokens, r.actual_output_tokens"
            " from gateway_generation g join quotas_reservation r on r.request_id = g.id"
            " where g.id = %s",
            generation,
        )

    wait_until(lambda: bool(rows()), timeout=15, what="the ledger rows (Celery beat flush)")
    [row] = rows()
    assert row == (MODEL, "alpha", 200, expected, 0, 0, "embeddings", "reconciled", 0, expected, 0)
    record = httpx.get(
        f"{stack.base_url}/v1/generation",
        params={"id": generation},
        headers={"Authorization": f"Bearer {KEY}"},
    ).json()["data"]
    assert record["api_type"] == "embeddings"
    assert record["native_tokens_prompt"] == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": ["ok", ""]}, "input[1]"),
        ({"model": MODEL, "input": [[1, 2], ["x"]]}, "input[1]"),
        ({"model": MODEL, "input": [1, -2]}, "input[0]"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": MODEL, "input": "x", "dimensions": "8"}, "dimensions"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "input": "x", "stream": True}, "stream"),
        ({"input": "x"}, "model"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(stack, body, param):
    answer = httpx.post(
        f"{stack.base_url}/v1/embeddings",
        headers={"Authorization": f"Bearer {KEY}"},
        json=body,
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(param)


def test_chat_and_embeddings_models_are_not_mixed_up(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "no_endpoint_available"
    assert "embeddings_only" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="acme/chat-small", input="hi")
    assert "no_embeddings" in caught.value.message


def test_an_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="acme/no-such-embedder", input="x")


def test_a_repeat_under_an_idempotency_key_is_replayed_not_sent_again(stack, client):
    headers = {"Idempotency-Key": "e2e-embeddings-once"}
    calls = f"{stack.sim_url('alpha')}/_calls"
    first = client.embeddings.with_raw_response.create(
        model=MODEL, input=TEXT, user="e2e-emb-idem", extra_headers=headers
    )
    again = client.embeddings.with_raw_response.create(
        model=MODEL, input=TEXT, user="e2e-emb-idem", extra_headers=headers
    )

    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().data[0].embedding == first.parse().data[0].embedding
    assert httpx.get(calls).json()["by_caller"]["e2e-emb-idem"] == 1


def test_a_deferred_batch_runs_as_a_job(stack):
    indexer = "sk-sy-test-acme-indexer-0001"  # acme/search/indexer: background (defer)
    auth = {"Authorization": f"Bearer {indexer}"}
    accepted = httpx.post(
        f"{stack.base_url}/v1/embeddings",
        headers={**auth, "Prefer": "respond-async"},
        json={"model": "text-embedding-3-small", "input": ["index me", "and me"]},
        timeout=30,
    )
    assert accepted.status_code == 202, accepted.text
    found: dict = {}

    def done() -> bool:
        found.update(
            httpx.get(f"{stack.base_url}{accepted.headers['location']}", headers=auth).json()
        )
        return found.get("status") in ("succeeded", "failed", "cancelled")

    wait_until(done, timeout=30, what="the embeddings job", interval=0.2)
    assert found["status"] == "succeeded", found
    body = found["response"]["body"]
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == count_text_tokens("index me") + count_text_tokens(
        "and me"
    )


# -- aliases ---------------------------------------------------------------------------------


def test_an_alias_serves_chat_as_its_model(client):
    raw = client.chat.completions.with_raw_response.create(
        model="claude-sonnet-4-5",
        messages=[{"role": "user", "content": "Hello through an alias"}],
        extra_body={"provider": {"only": ["alpha"]}},
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.model == "acme/chat-large"  # the answer names the model that served it
    assert raw.headers["x-switchyard-provider"] == "alpha"


def test_an_alias_keeps_its_sort_suffix_and_works_as_a_fallback(client):
    nitro = client.chat.completions.with_raw_response.create(
        model="claude-sonnet-4-5:nitro", messages=[{"role": "user", "content": "fast please"}]
    )
    assert "throughput" in nitro.headers["x-switchyard-route"]
    fallback = client.chat.completions.create(
        model="acme/chat-small",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"models": ["claude-sonnet-4-5"]},
    )
    assert fallback.choices[0].message.content


def test_an_alias_serves_embeddings(client):
    answer = client.embeddings.create(model="text-embedding-3-small", input=TEXT)
    assert answer.model == MODEL and len(answer.data[0].embedding) == 1536


def test_the_models_list_names_every_alias_and_retrieves_by_it(client):
    listed = {m.id: m for m in client.models.list()}

    alias = listed["claude-sonnet-4-5"]
    assert alias.model_extra["canonical_slug"] == "acme/chat-large"
    assert listed["acme/chat-large"].model_extra["aliases"] == ["claude-sonnet-4-5"]
    assert listed["text-embedding-3-small"].model_extra["canonical_slug"] == MODEL
    retrieved = client.models.retrieve("claude-sonnet-4-5")
    assert retrieved.id == "claude-sonnet-4-5"
    assert retrieved.model_extra["context_length"] == alias.model_extra["context_length"]


def test_an_alias_is_bound_by_the_keys_allowed_models(stack):
    small_only = openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key="sk-sy-test-acme-small-only", max_retries=0
    )
    with pytest.raises(openai.PermissionDeniedError):
        small_only.chat.completions.create(
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}]
        )
    assert "claude-sonnet-4-5" not in {m.id for m in small_only.models.list()}


# -- a refusal, explained --------------------------------------------------------------------

TIGHT = "e2e/embed-tight"


def _tight_model(config: dict) -> None:
    config["models"].append(
        {
            "slug": TIGHT,
            "endpoints": [
                {
                    "provider": "alpha",
                    "upstream_model": "embed-small",
                    "price": {"input": 0.02, "cached_input": 0.02, "output": 0},
                    "context_window": 8192,
                    "max_output": 1,
                    "supports": ["embeddings"],
                }
            ],
            "limits": [{"dimension": "requests", "capacity": 1, "per": "1m"}],
        }
    )


@pytest.fixture(scope="module")
def tight_stack():
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        celery=False,
        config_edit=_tight_model,
    )
    try:
        yield running.start()
    finally:
        running.stop()


def test_a_refusal_says_why_and_when_to_come_back(tight_stack):
    client = openai.OpenAI(base_url=f"{tight_stack.base_url}/v1", api_key=KEY, max_retries=0)
    client.embeddings.create(model=TIGHT, input="the one request a minute")
    calls_before = httpx.get(f"{tight_stack.sim_url('alpha')}/_stats").json()["requests"]

    with pytest.raises(openai.RateLimitError) as caught:
        client.embeddings.create(model=TIGHT, input="one too many")

    response = caught.value.response
    assert response.status_code == 429
    assert 1 <= int(response.headers["Retry-After"]) <= 60
    reason = response.headers["x-switchyard-reason"]
    assert reason and reason != "ok"
    assert caught.value.body["reason"] == reason
    assert "model:e2e/embed-tight" in response.headers["x-switchyard-bucket"]
    # Refused by the broker: the provider never saw it.
    assert httpx.get(f"{tight_stack.sim_url('alpha')}/_stats").json()["requests"] == calls_before


def test_a_client_that_leaves_before_the_vectors_come_leaves_no_reservation(tight_stack):
    alpha = tight_stack.sim_url("alpha")
    # Slow embed-small for a moment (2-3 s at the stack's latency scale) so the call is in
    # flight when the client gives up.
    slow = {"model": "embed-small", "for": "5s", "ttft_ms": {"median": 40000, "p95": 60000}}
    assert httpx.post(f"{alpha}/_incident", json=slow).status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{tight_stack.base_url}/v1/embeddings",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": MODEL, "input": "never mind"},
            timeout=httpx.Timeout(30, read=0.5),
        )
    # The slot comes back at once (C10), and the provider's call was cancelled with it. (An
    # allowance that holds slots of the app gives them back IDLE_AFTER after its last request.)
    wait_until(
        lambda: bucket_available(tight_stack, "app:acme/search/web:concurrency") == 20,
        timeout=1.5 + IDLE_AFTER,
        what="the app's concurrency slot to come back",
    )
    wait_until(
        lambda: httpx.get(f"{alpha}/_stats").json()["concurrency"] == 0,
        timeout=2,
        what="the simulator to see the call cancelled",
    )
