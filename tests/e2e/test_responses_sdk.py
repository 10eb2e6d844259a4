"""The official openai SDK's Responses API against the gateway and the simulator (issue 16
item 3): create, stream, a function-tool round trip, previous_response_id, retrieve and delete,
parse with a Pydantic model; a refusal explained, a client that leaves mid-stream, usage that
reconciles with the ledger."""

import json
import os

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.conftest import e2e_config
from tests.e2e.brokerstate import bucket_available
from tests.stack import Stack, free_port, wait_until

pytestmark = pytest.mark.e2e

ACME_WEB = "sk-sy-test-acme-web-0001"
ACME_INDEXER = "sk-sy-test-acme-indexer-0001"  # another app of the same tenant
GLOBEX = "sk-sy-test-globex-0001"  # another tenant
TIGHT = "sk-sy-test-acme-tight-0001"  # an app allowed two requests a minute
MODEL = "acme/chat-large"
ALPHA = {"provider": {"only": ["alpha"]}}  # OpenAI protocol, supports tools and response_format
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def stack():
    """The e2e deployment, plus an app whose own limit refuses its third request in a minute
    (nothing else shares that bucket, so the refusal is this module's alone)."""
    base = e2e_config(free_port(), free_port())

    def edit(config):
        base(config)
        config["tenants"][0]["teams"][0]["apps"].append(
            {
                "name": "tight",
                "environment": "production",
                "default_workload": "interactive",
                "limits": [{"dimension": "requests", "capacity": 2, "per": "1m"}],
                "keys": [{"name": "ci", "secret": TIGHT}],
            }
        )

    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        config_edit=edit,
    )
    try:
        yield running.start()
    finally:
        running.stop()


def sdk(stack, key=ACME_WEB):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)


@pytest.fixture
def client(stack):
    return sdk(stack)


def ledger_row(stack, generation_id):
    def row():
        return stack.sql(
            "select status, input_tokens, output_tokens, cost, detail->>'door', streamed"
            " from gateway_generation where id = %s",
            generation_id,
        )

    wait_until(lambda: bool(row()), timeout=15, what="the ledger row (Celery beat flush)")
    return row()[0]


def reservation_row(stack, generation_id):
    def row():
        return stack.sql(
            "select outcome, actual_input_tokens, actual_output_tokens"
            " from quotas_reservation where request_id = %s",
            generation_id,
        )

    wait_until(lambda: bool(row()), timeout=15, what="the reservation ledger row")
    return row()[0]


def test_it_creates_a_response_and_its_usage_reconciles_exactly(stack, client):
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input="Say hello in three words.",
        instructions="Be brief.",
        max_output_tokens=60,
        extra_body=ALPHA,
    )
    response = raw.parse()

    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.model == MODEL and response.instructions == "Be brief."
    assert response.output_text
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert raw.headers["x-switchyard-provider"] == "alpha"
    assert response.store is True

    generation_id = raw.headers["x-request-id"]
    assert response.id == "resp_" + generation_id.removeprefix("gen-")
    status, input_tokens, output_tokens, cost, door, streamed = ledger_row(stack, generation_id)
    assert (status, door, streamed) == (200, "responses", False)
    assert (input_tokens, output_tokens) == (usage.input_tokens, usage.output_tokens)
    assert float(cost) == pytest.approx(response.usage.model_extra["cost"], rel=1e-6)
    outcome, actual_input, actual_output = reservation_row(stack, generation_id)
    assert outcome == "reconciled"
    assert (actual_input, actual_output) == (usage.input_tokens, usage.output_tokens)
    generation = httpx.get(
        f"{stack.base_url}/v1/generation",
        params={"id": generation_id},
        headers={"Authorization": f"Bearer {ACME_WEB}"},
    ).json()["data"]
    assert generation["api_type"] == "responses"


def test_it_streams_the_responses_event_sequence(stack, client):
    with client.responses.stream(
        model=MODEL, input="Count to ten.", max_output_tokens=4000, extra_body=ALPHA
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()

    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and final.status == "completed"
    assert "response.output_item.added" in kinds and "response.output_item.done" in kinds
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0

    status, input_tokens, output_tokens, _, door, streamed = ledger_row(
        stack, "gen-" + final.id.removeprefix("resp_")
    )
    assert (status, door, streamed) == (200, "responses", True)
    assert (input_tokens, output_tokens) == (final.usage.input_tokens, final.usage.output_tokens)
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_it_ends_a_stream_cut_at_max_output_tokens_as_incomplete(client):
    events = list(
        client.responses.create(
            model=MODEL,
            input="Tell a long story.",
            max_output_tokens=16,
            stream=True,
            extra_body=ALPHA,
        )
    )

    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.usage.output_tokens == 16


def test_it_round_trips_a_function_tool(client):
    asked = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = client.responses.create(
        model=MODEL, input=asked, tools=[WEATHER], tool_choice="required", extra_body=ALPHA
    )

    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    assert "city" in json.loads(call.arguments)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}

    # Sent back in full, as a stateless client does …
    replayed = client.responses.create(
        model=MODEL,
        input=[*asked, *(item.model_dump(exclude_none=True) for item in first.output), result],
        tools=[WEATHER],
        store=False,
        extra_body=ALPHA,
    )
    # … or continued from the stored turn.
    continued = client.responses.create(
        model=MODEL,
        input=[result],
        previous_response_id=first.id,
        tools=[WEATHER],
        tool_choice="none",
        extra_body=ALPHA,
    )

    for answer in (replayed, continued):
        assert answer.status in ("completed", "incomplete")
        assert answer.output and answer.output[0].type == "message"
        assert answer.output_text
    assert continued.previous_response_id == first.id
    # The stored turn's question, call and result all went to the provider again.
    assert continued.usage.input_tokens > first.usage.input_tokens
    assert replayed.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(replayed.id)


def test_it_continues_a_conversation_from_previous_response_id(stack, client):
    first = client.responses.create(
        model=MODEL, input="My name is Ada. " * 20, max_output_tokens=40, extra_body=ALPHA
    )
    second = client.responses.create(
        model=MODEL,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=40,
        extra_body=ALPHA,
    )

    assert second.previous_response_id == first.id
    # The earlier input and answer came first: at least their tokens are read again.
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens
    third = client.responses.create(
        model=MODEL, input="And again?", previous_response_id=second.id, extra_body=ALPHA
    )
    assert third.usage.input_tokens >= second.usage.input_tokens + second.usage.output_tokens


@pytest.mark.parametrize("other", [ACME_INDEXER, GLOBEX])
def test_it_keeps_a_stored_response_to_the_app_that_made_it(stack, client, other):
    made = client.responses.create(model=MODEL, input="Remember this.", extra_body=ALPHA)
    outsider = sdk(stack, other)

    for attempt in (
        lambda: outsider.responses.retrieve(made.id),
        lambda: outsider.responses.delete(made.id),
        lambda: outsider.responses.create(
            model="acme/chat-small", input="and?", previous_response_id=made.id
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert client.responses.retrieve(made.id).output_text == made.output_text


def test_it_retrieves_and_deletes_a_stored_response(client):
    made = client.responses.create(model=MODEL, input="Keep me.", extra_body=ALPHA)

    fetched = client.responses.retrieve(made.id)
    assert fetched.id == made.id and fetched.output_text == made.output_text
    assert fetched.usage.total_tokens == made.usage.total_tokens
    client.responses.delete(made.id)

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=MODEL, input="x", previous_response_id=made.id)
    assert missing.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(made.id)


def test_it_names_the_field_of_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])

    assert refused.value.body["param"] == "tools[0].type"
    assert "function tools only" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as bad_id:
        client.responses.retrieve("not-a-response")
    assert bad_id.value.body["param"] == "id"


class Weather(BaseModel):
    city: str
    temperature_c: float


def test_it_parses_a_structured_answer_into_a_pydantic_model(client):
    parsed = client.responses.parse(
        model=MODEL,
        input="The weather in Oslo, as JSON.",
        text_format=Weather,
        extra_body=ALPHA,
    )

    assert isinstance(parsed.output_parsed, Weather)
    assert parsed.output_parsed.city


def test_it_explains_a_refusal_in_openais_envelope(stack):
    client = sdk(stack, TIGHT)
    errors = []
    for _ in range(3):  # the app's own bucket holds two
        try:
            client.responses.create(model="acme/chat-small", input="hi")
        except openai.RateLimitError as exc:
            errors.append(exc)

    [refused] = errors
    headers = refused.response.headers
    assert refused.status_code == 429
    assert int(headers["retry-after"]) >= 1
    reason = headers["x-switchyard-reason"]
    assert reason and refused.body["reason"] == reason
    assert refused.body["type"] == "rate_limit_error"
    assert refused.body["code"] == "rate_limit_exceeded"
    assert "app:acme/search/tight:requests:1m" in headers["x-switchyard-bucket"]


def test_it_leaves_no_reservation_behind_a_client_that_leaves_mid_stream(stack):
    stats = f"{stack.sim_url('alpha')}/_stats"
    slow = {"model": "chat-large", "for": "1s", "tokens_per_s": {"median": 2, "p05": 1}}
    assert httpx.post(f"{stack.sim_url('alpha')}/_incident", json=slow).status_code == 200
    payload = {
        "model": MODEL,
        "input": "write a long story",
        "max_output_tokens": 4000,
        "stream": True,
        **ALPHA,
    }
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST",
            f"{stack.base_url}/v1/responses",
            headers={"Authorization": f"Bearer {ACME_WEB}"},
            json=payload,
        ) as response,
    ):
        assert response.status_code == 200
        generation_id = response.headers["x-request-id"]
        lines = response.iter_lines()
        assert next(lines) == "event: response.created"
        assert httpx.get(stats).json()["concurrency"] >= 1
        # Leaving the block closes the connection mid-stream.
    wait_until(
        lambda: httpx.get(stats).json()["concurrency"] == 0,
        timeout=5,
        what="the simulator to see the upstream call cancelled",
    )
    wait_until(
        lambda: bucket_available(stack, "app:acme/search/web:concurrency") == 20,
        timeout=5,
        what="the app's concurrency slot to come back",
    )
    status, *_ = ledger_row(stack, generation_id)
    assert status == 499
    outcome, _, _ = reservation_row(stack, generation_id)
    assert outcome == "reconciled"
    # Nothing whole was delivered, so nothing was stored.
    with pytest.raises(openai.NotFoundError):
        sdk(stack).responses.retrieve("resp_" + generation_id.removeprefix("gen-"))
    wait_until(
        lambda: not httpx.get(stats).json()["incidents"], timeout=5, what="the slow-down to end"
    )


def test_it_runs_a_deferred_response_as_a_job(stack):
    """E3: a background app's request with Prefer: respond-async is a job whose answer is the
    Response, run by the Celery worker through the same door."""
    indexer = sdk(stack, ACME_INDEXER)
    accepted = indexer.responses.with_raw_response.create(
        model="acme/chat-small", input="index me", extra_headers={"Prefer": "respond-async"}
    )
    assert accepted.status_code == 202
    location = accepted.headers["Location"]

    def finished():
        job = httpx.get(
            f"{stack.base_url}{location}", headers={"Authorization": f"Bearer {ACME_INDEXER}"}
        ).json()
        return job if job["status"] in ("succeeded", "failed") else None

    wait_until(lambda: finished() is not None, timeout=20, what="the job to finish")
    job = finished()
    assert job["status"] == "succeeded"
    body = job["response"]["body"]
    assert body["object"] == "response" and body["output"][0]["type"] == "message"
    assert body["usage"]["total_tokens"] > 0

    # A job's run has no earlier turn to hand: continuing one is refused at once.
    with pytest.raises(openai.BadRequestError) as refused:
        indexer.responses.create(
            model="acme/chat-small",
            input="and?",
            previous_response_id=body["id"],
            extra_headers={"Prefer": "respond-async"},
        )
    assert refused.value.body["param"] == "previous_response_id"


def test_it_refuses_an_unknown_key_in_the_envelope(stack):
    with pytest.raises(openai.AuthenticationError) as refused:
        sdk(stack, "sk-sy-not-a-key").responses.create(model=MODEL, input="hi")

    assert refused.value.body["code"] == "invalid_api_key"


def test_it_replays_a_response_under_its_idempotency_key(client):
    def create():
        return client.responses.with_raw_response.create(
            model="acme/chat-small", input="once only", extra_headers={"Idempotency-Key": "r-1"}
        )

    first, again = create(), create()

    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.parse().id == first.parse().id
    assert client.responses.retrieve(first.parse().id).output_text == first.parse().output_text
