"""The official openai SDK against the running gateway, for both wire protocols (issue 2)."""

import json

import openai
import pytest

pytestmark = pytest.mark.e2e

ACME_WEB_KEY = "sk-sy-test-acme-web-0001"
# acme/chat-large is served by alpha (OpenAI protocol) and beta (Anthropic Messages), among
# others: `provider.only` (G13) pins each test to one wire protocol.
MODELS = {"openai": ("acme/chat-large", "alpha"), "anthropic": ("acme/chat-large", "beta")}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
def client(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=ACME_WEB_KEY, max_retries=0)


def only(provider):
    return {"provider": {"only": [provider]}}


@pytest.mark.parametrize("protocol", MODELS)
def test_it_completes_a_request(client, protocol):
    model, provider = MODELS[protocol]
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello in three words."}],
        extra_body=only(provider),
    )
    completion = raw.parse()

    assert completion.model == model
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert raw.headers["x-switchyard-provider"] == provider
    assert completion.model_extra["provider"] == provider


@pytest.mark.parametrize("protocol", MODELS)
def test_it_streams_chunks_then_usage(client, protocol):
    model, provider = MODELS[protocol]
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to ten."}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body=only(provider),
    )
    chunks = list(stream)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert text
    assert finish and finish[-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None, "usage comes last"
    assert chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {chunks[0].id}
    assert chunks[0].model_extra["provider"] == provider


@pytest.mark.parametrize("protocol", MODELS)
def test_it_streams_without_usage_when_not_asked(client, protocol):
    model, provider = MODELS[protocol]
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hi"}],
            stream=True,
            extra_body=only(provider),
        )
    )
    assert chunks and all(c.usage is None for c in chunks)


@pytest.mark.parametrize("protocol", MODELS)
def test_it_round_trips_a_tool_call(client, protocol):
    model, provider = MODELS[protocol]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        extra_body=only(provider),
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["city"], str)

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18}'},
    ]
    second = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER_TOOL], extra_body=only(provider)
    )
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.content


@pytest.mark.parametrize("protocol", MODELS)
def test_it_streams_a_tool_call(client, protocol):
    model, provider = MODELS[protocol]
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
            stream=True,
            extra_body=only(provider),
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert calls[0].function.name == "get_weather" and calls[0].id
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert "city" in json.loads(arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_it_lists_the_models_the_key_may_use(client):
    models = {m.id: m for m in client.models.list()}
    assert {"acme/chat-large", "acme/chat-small"} <= set(models)
    large = models["acme/chat-large"]
    assert large.created > 1_700_000_000  # a real timestamp: the model row's creation
    # OpenRouter's fields reach the SDK's model object as extras.
    assert large.model_extra["context_length"] == 200000
    assert large.model_extra["pricing"]["prompt"] == "0.0000005"
    assert "tools" in large.model_extra["supported_parameters"]


def test_it_retrieves_one_model_and_says_404_for_one_it_does_not_know(client):
    assert client.models.retrieve("acme/chat-large").id == "acme/chat-large"
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("acme/nope")
    assert refused.value.body["code"] == "model_not_found"
