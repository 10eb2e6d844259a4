"""The official anthropic SDK against the running gateway's Messages door (issue 16): an
Anthropic-protocol endpoint (beta) gets the request as it came, an OpenAI-protocol one (alpha)
gets it translated; either way the SDK sees Anthropic's answers, streams and errors."""

import os
import re
import time

import anthropic
import httpx
import pytest

from quotas.allowances import IDLE_AFTER
from tests.conftest import e2e_config
from tests.e2e.brokerstate import bucket_available
from tests.stack import SCRAPE_TOKEN, Stack, free_port, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"
INDEXER_KEY = "sk-sy-test-acme-indexer-0001"  # a background app: it may defer its requests
# One app per protocol allowed a single request a minute: the second is refused by the broker.
LIMITED = {
    "anthropic": "sk-sy-test-acme-limited-anthropic",
    "openai": "sk-sy-test-acme-limited-openai",
}
PROVIDERS = {"anthropic": "beta", "openai": "alpha"}
MODEL = "acme/chat-large"  # served by alpha (OpenAI protocol) and beta (Anthropic Messages)
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def config_edit(config: dict) -> None:
    e2e_config(free_port(), free_port())(config)
    search = config["tenants"][0]["teams"][0]
    for protocol, secret in LIMITED.items():
        search["apps"].append(
            {
                "name": f"limited-{protocol}",
                "environment": "production",
                "default_workload": "interactive",
                "limits": [{"dimension": "requests", "capacity": 1, "per": "1m"}],
                "keys": [{"name": "ci", "secret": secret}],
            }
        )


@pytest.fixture(scope="module")
def stack():
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        config_edit=config_edit,
    )
    try:
        yield running.start()
    finally:
        running.stop()


def sdk(stack, key=KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.base_url, api_key=key, max_retries=0)


def only(protocol):
    return {"provider": {"only": [PROVIDERS[protocol]], "allow_fallbacks": False}}


def ledger(stack, generation_id):
    def rows():
        return stack.sql(
            "select g.status, g.input_tokens, g.cached_input_tokens, g.output_tokens,"
            " g.provider, g.streamed, g.detail->>'door', r.outcome,"
            " r.actual_input_tokens, r.actual_output_tokens, r.estimated_output_tokens"
            " from gateway_generation g join quotas_reservation r on r.request_id = g.id"
            " where g.id = %s",
            generation_id,
        )

    wait_until(lambda: bool(rows()), timeout=15, what="the ledger rows")
    [row] = rows()
    return dict(
        zip(
            [
                "status",
                "input",
                "cached",
                "output",
                "provider",
                "streamed",
                "door",
                "outcome",
                "actual_input",
                "actual_output",
                "reserved_output",
            ],
            row,
            strict=True,
        )
    )


def assert_reconciled(stack, generation_id, usage, *, protocol, streamed, max_tokens):
    """The ledger holds what the client was told it used, the reservation settled to it."""
    row = ledger(stack, generation_id)
    sent_input = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    sent_input += usage.cache_creation_input_tokens or 0
    assert row["status"] == 200 and row["door"] == "messages"
    assert (row["provider"], row["streamed"]) == (PROVIDERS[protocol], streamed)
    assert (row["input"], row["output"]) == (sent_input, usage.output_tokens)
    assert (row["actual_input"], row["actual_output"]) == (sent_input, usage.output_tokens)
    assert row["outcome"] == "reconciled" and row["reserved_output"] == max_tokens


@pytest.mark.parametrize("protocol", PROVIDERS)
def test_messages_create_answers_in_anthropics_shape(stack, protocol):
    raw = sdk(stack).messages.with_raw_response.create(
        model=MODEL,
        max_tokens=200,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Say hello in three words."}],
        metadata={"user_id": "user_e2e_session_1"},
        extra_body=only(protocol),
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"},
    )
    message = raw.parse()

    assert message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    assert message.id == raw.headers["x-request-id"]
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert raw.headers["x-switchyard-provider"] == PROVIDERS[protocol]
    assert raw.headers["x-switchyard-reason"] == "ok"
    # Beta's own body came through as it is (the simulator marks its usage with a service
    # tier); alpha's answer was translated, and has none.
    passed_through = message.usage.service_tier == "standard"
    assert passed_through == (protocol == "anthropic")
    assert_reconciled(
        stack, message.id, message.usage, protocol=protocol, streamed=False, max_tokens=200
    )


@pytest.mark.parametrize("protocol", PROVIDERS)
def test_messages_stream_sends_text_events_the_sdk_reassembles(stack, protocol):
    with sdk(stack).messages.stream(
        model=MODEL,
        max_tokens=120,
        messages=[{"role": "user", "content": "Count to ten."}],
        extra_body=only(protocol),
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
        provider = stream.response.headers["x-switchyard-provider"]

    assert text and message.content[0].text == text
    assert message.model == MODEL and message.id.startswith("gen-")
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0
    assert provider == PROVIDERS[protocol]
    assert_reconciled(
        stack, message.id, message.usage, protocol=protocol, streamed=True, max_tokens=120
    )


@pytest.mark.parametrize("protocol", PROVIDERS)
def test_messages_stream_with_a_tool_then_the_tool_result_round_trip(stack, protocol):
    client = sdk(stack)
    question = {"role": "user", "content": "What is the weather in Paris?"}
    with client.messages.stream(
        model=MODEL,
        max_tokens=300,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=[question],
        extra_body=only(protocol),
    ) as stream:
        events = [event.type for event in stream]
        first = stream.get_final_message()

    assert "input_json" in events, "the arguments come as input_json deltas"
    assert first.stop_reason == "tool_use"
    [call] = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input["city"], str)

    second = client.messages.create(
        model=MODEL,
        max_tokens=200,
        tools=[WEATHER],
        messages=[
            question,
            {
                "role": "assistant",
                "content": [block.model_dump(exclude_none=True) for block in first.content],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call.id,
                        "content": '{"temperature_c": 18}',
                    }
                ],
            },
        ],
        extra_body=only(protocol),
    )
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.content[0].type == "text" and second.content[0].text


def test_count_tokens_answers_from_the_estimator(stack):
    client = sdk(stack)
    short = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    longer = client.messages.count_tokens(
        model=MODEL,
        system="You are a careful assistant. " * 50,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Hi"}],
    )
    assert 0 < short.input_tokens < longer.input_tokens
    by_alias = client.messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "Hi"}]
    )
    assert by_alias.input_tokens == short.input_tokens
    assert longer.input_tokens > 300  # ~1,450 characters of system prompt at ~4 per token
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.count_tokens(
            model="acme/nope", messages=[{"role": "user", "content": "Hi"}]
        )
    assert unknown.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError):
        sdk(stack, key="sk-sy-nope").messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}]
        )


@pytest.mark.parametrize("protocol", PROVIDERS)
def test_a_refusal_raises_rate_limit_error_with_retry_after_and_the_reason(stack, protocol):
    client = sdk(stack, key=LIMITED[protocol])
    request = {
        "model": MODEL,
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "hi"}],
        "extra_body": only(protocol),
    }
    client.messages.create(**request)  # the app's one request this minute
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(**request)

    error = refused.value
    assert error.status_code == 429
    assert error.body["type"] == "error"
    assert error.body["error"]["type"] == "rate_limit_error"
    assert error.body["error"]["reason"] == error.response.headers["x-switchyard-reason"]
    assert float(error.response.headers["retry-after"]) >= 1
    assert error.body["request_id"] == error.response.headers["x-request-id"]


def test_an_overloaded_provider_raises_overloaded_error(stack):
    incident = {"model": "chat-large-fast", "for": "2s", "overload_rate": 1.0}
    assert httpx.post(f"{stack.sim_url('beta')}/_incident", json=incident).status_code == 200
    try:
        with pytest.raises(anthropic.OverloadedError) as refused:
            sdk(stack).messages.create(
                model=MODEL,
                max_tokens=20,
                messages=[{"role": "user", "content": "hi"}],
                extra_body=only("anthropic"),
            )
        assert refused.value.status_code == 529
        assert refused.value.body["error"]["type"] == "overloaded_error"
    finally:
        wait_until(
            lambda: not httpx.get(f"{stack.sim_url('beta')}/_stats").json()["incidents"],
            timeout=5,
            what="the incident to end",
        )


def test_bad_requests_raise_bad_request_error_naming_the_field(stack):
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk(stack).messages.create(
            model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert refused.value.body["error"]["param"] == "max_tokens"
    response = httpx.get(f"{stack.base_url}/v1/messages", headers={"x-api-key": KEY})
    assert (
        response.status_code == 405 and response.json()["error"]["type"] == "invalid_request_error"
    )


def test_claude_codes_query_string_and_bearer_auth_are_accepted(stack):
    response = httpx.post(
        f"{stack.base_url}/v1/messages?beta=true",
        headers={"Authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"},
        json={"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["type"] == "message"


@pytest.mark.parametrize("protocol", PROVIDERS)
def test_a_client_that_leaves_mid_stream_leaves_no_reservation(stack, protocol):
    provider = PROVIDERS[protocol]
    upstream_model = {"anthropic": "chat-large-fast", "openai": "chat-large"}[protocol]
    slow = {"model": upstream_model, "for": "2s", "tokens_per_s": {"median": 2, "p05": 1}}
    assert httpx.post(f"{stack.sim_url(provider)}/_incident", json=slow).status_code == 200
    body = {
        "model": MODEL,
        "max_tokens": 4000,
        "stream": True,
        "messages": [{"role": "user", "content": "write a long story"}],
        **only(protocol),
    }
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST", f"{stack.base_url}/v1/messages", headers={"x-api-key": KEY}, json=body
        ) as response,
    ):
        assert response.status_code == 200
        generation_id = response.headers["x-request-id"]
        lines = response.iter_lines()  # kept: dropping the iterator closes the stream
        assert next(lines) == "event: message_start"
        assert bucket_available(stack, "app:acme/search/web:concurrency") < 20
        # Leaving the block closes the connection mid-stream.
    wait_until(  # or when an allowance holding slots of the app ends (IDLE_AFTER)
        lambda: bucket_available(stack, "app:acme/search/web:concurrency") == 20,
        timeout=1.5 + IDLE_AFTER,
        what="the app's concurrency slot to come back",
    )

    def rows():
        return stack.sql(
            "select g.status, g.reason_code, g.cancelled, r.outcome"
            " from gateway_generation g join quotas_reservation r on r.request_id = g.id"
            " where g.id = %s",
            generation_id,
        )

    wait_until(lambda: bool(rows()), timeout=15, what="the cancelled stream's ledger rows")
    status, reason, cancelled, outcome = rows()[0]
    assert (status, reason, cancelled) == (499, "client_disconnected", True)
    assert outcome == "reconciled", "settled at once, not left for its lease to expire"
    wait_until(
        lambda: not httpx.get(f"{stack.sim_url(provider)}/_stats").json()["incidents"],
        timeout=5,
        what="the slow-down to end",
    )


@pytest.mark.parametrize("protocol", PROVIDERS)
def test_a_deferred_request_is_answered_by_a_worker_in_anthropics_shape(stack, protocol):
    accepted = httpx.post(
        f"{stack.base_url}/v1/messages",
        headers={"x-api-key": INDEXER_KEY, "Prefer": "respond-async"},
        json={
            "model": MODEL,
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "later, please"}],
            **only(protocol),
        },
        timeout=30,
    )
    assert accepted.status_code == 202, accepted.text
    location = accepted.headers["location"]
    job = {}

    def finished():
        job.update(
            httpx.get(
                f"{stack.base_url}{location}",
                headers={"Authorization": f"Bearer {INDEXER_KEY}"},
                timeout=10,
            ).json()
        )
        return job.get("status") in ("succeeded", "failed")

    wait_until(finished, timeout=30, what="the job to finish", interval=0.2)
    assert job["status"] == "succeeded", job
    response = job["response"]
    assert response["status_code"] == 200
    message = anthropic.types.Message.model_validate(response["body"])
    assert message.id == job["generation_id"] and message.model == MODEL
    assert message.content[0].text
    assert response["headers"]["x-switchyard-provider"] == PROVIDERS[protocol]


def test_a_repeated_idempotency_key_replays_the_message_and_the_record_names_the_door(stack):
    client = sdk(stack)
    request = {
        "model": MODEL,
        "max_tokens": 30,
        "messages": [{"role": "user", "content": "once only"}],
        "extra_headers": {"Idempotency-Key": f"messages-{time.time_ns()}"},
    }
    first = client.messages.with_raw_response.create(**request)
    again = client.messages.with_raw_response.create(**request)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().model_dump() == first.parse().model_dump()

    generation_id = first.parse().id
    ledger(stack, generation_id)  # written off the hot path: wait for it
    record = httpx.get(
        f"{stack.base_url}/v1/generation",
        params={"id": generation_id},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    ).json()["data"]
    assert record["api_type"] == "messages" and record["model"] == MODEL
    scrape = httpx.get(
        f"{stack.base_url}/metrics",
        headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"},
        timeout=10,
    ).text
    assert re.search(r'switchyard_requests_total\{[^}]*door="messages"[^}]*\} [1-9]', scrape)
