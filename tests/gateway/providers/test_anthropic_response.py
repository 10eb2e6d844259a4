"""Anthropic Messages response and stream → OpenAI chat.completion and chunks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.providers.anthropic import AnthropicAdapter
from gateway.providers.base import JSON, Outcome, SSEEvent, StreamError, StreamTranslator, Usage

ADAPTER = AnthropicAdapter()

MESSAGE: JSON = {
    "id": "msg_01Aq9w938a90dw8q",
    "type": "message",
    "role": "assistant",
    "model": "chat-large-fast",
    "content": [
        {"type": "text", "text": "Let me check "},
        {"type": "text", "text": "the weather."},
        {
            "type": "tool_use",
            "id": "toolu_01A09q90qw90lq917835lq9",
            "name": "get_weather",
            "input": {"location": "San Francisco, CA", "unit": "celsius"},
        },
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 30,
        "cache_creation_input_tokens": 500,
        "cache_read_input_tokens": 2000,
        "output_tokens": 45,
    },
}


def test_it_translates_a_message_with_text_and_tool_use() -> None:
    Message.model_validate(MESSAGE)  # the fixture is a real Anthropic message
    completion = ADAPTER.parse_completion(
        MESSAGE, response_id="gen-1", model="acme/chat-large", created=1700000000
    )
    assert completion.body == {
        "id": "gen-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "acme/chat-large",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me check the weather.",
                    "tool_calls": [
                        {
                            "id": "toolu_01A09q90qw90lq917835lq9",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": '{"location":"San Francisco, CA","unit":"celsius"}',
                            },
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 2530,
            "completion_tokens": 45,
            "total_tokens": 2575,
            "prompt_tokens_details": {"cached_tokens": 2000},
        },
    }
    assert completion.usage == Usage(input_tokens=2530, cached_input_tokens=2000, output_tokens=45)
    assert completion.finish_reason == "tool_calls"
    ChatCompletion.model_validate(completion.body)


def test_it_gives_null_content_for_a_tool_only_answer_and_empty_for_nothing() -> None:
    tool_only = {**MESSAGE, "content": MESSAGE["content"][2:]}
    message = ADAPTER.parse_completion(tool_only, response_id="g", model="m").body["choices"][0]
    assert message["message"]["content"] is None
    empty = {**MESSAGE, "content": [], "stop_reason": "end_turn"}
    message = ADAPTER.parse_completion(empty, response_id="g", model="m").body["choices"][0]
    assert message["message"] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        ("model_context_window_exceeded", "length"),
        ("something_new", "stop"),
        (None, "stop"),
    ],
)
def test_it_maps_stop_reasons(stop_reason: str | None, finish_reason: str) -> None:
    data = {**MESSAGE, "stop_reason": stop_reason}
    assert ADAPTER.parse_completion(data, response_id="g", model="m").finish_reason == finish_reason


def test_it_reports_no_usage_rather_than_zero() -> None:
    data = {k: v for k, v in MESSAGE.items() if k != "usage"}
    completion = ADAPTER.parse_completion(data, response_id="g", model="m")
    assert completion.usage is None and "usage" not in completion.body


@pytest.mark.parametrize(
    ("data", "outcome"),
    [
        (
            {"type": "error", "error": {"type": "overloaded_error", "message": "x"}},
            Outcome.OVERLOAD,
        ),
        ({"type": "message", "content": "not a list"}, Outcome.PROVIDER_ERROR),
        ({"type": "message", "content": ["not a block"]}, Outcome.PROVIDER_ERROR),
    ],
)
def test_it_raises_for_error_or_malformed_2xx_bodies(data: JSON, outcome: Outcome) -> None:
    with pytest.raises(StreamError) as caught:
        ADAPTER.parse_completion(data, response_id="g", model="m")
    assert caught.value.classified.outcome is outcome


# ---- streams ----------------------------------------------------------------------------

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def new_translator() -> StreamTranslator:
    return ADAPTER.stream_translator(response_id="gen-7", model="acme/chat-large", created=99)


def accumulate(chunks: list[JSON]) -> Any:
    """What the official openai client assembles from these chunks."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion()


def test_it_recordings_are_valid_anthropic_events(
    recorded: Callable[[str], bytes], sse_events: Callable[[bytes], list[SSEEvent]]
) -> None:
    for name in ("anthropic_text.sse", "anthropic_tools.sse"):
        for event in sse_events(recorded(name)):
            if event.event != "ping":  # pings are not in the SDK's event union
                assert EVENT.validate_json(event.data).type == event.event


def test_it_streams_text_with_usage_including_cache(
    recorded: Callable[[str], bytes], replay: Callable[[StreamTranslator, bytes], list[JSON]]
) -> None:
    translator = new_translator()
    chunks = replay(translator, recorded("anthropic_text.sse"))
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
        {"content": ", Zoë — ça va?"},
        {},  # the finish chunk
        None,  # the usage chunk
    ]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop"
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"] == {
        "prompt_tokens": 2125,
        "completion_tokens": 15,
        "total_tokens": 2140,
        "prompt_tokens_details": {"cached_tokens": 2000},
    }
    assert all(
        (c["id"], c["model"], c["created"]) == ("gen-7", "acme/chat-large", 99) for c in chunks
    )
    assert translator.done and translator.finish_reason == "stop"
    assert translator.usage == Usage(input_tokens=2125, cached_input_tokens=2000, output_tokens=15)
    final = accumulate(chunks)
    assert final.choices[0].message.content == "Hello, Zoë — ça va?"
    assert final.usage.prompt_tokens == 2125


def test_it_streams_tool_calls_indexed_by_tool(
    recorded: Callable[[str], bytes], replay: Callable[[StreamTranslator, bytes], list[JSON]]
) -> None:
    translator = new_translator()
    chunks = replay(translator, recorded("anthropic_tools.sse"))
    tool_deltas = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert tool_deltas[0] == {
        "index": 0,
        "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert [d["index"] for d in tool_deltas] == [0, 0, 0, 1, 1, 1]  # empty partial skipped
    assert translator.finish_reason == "tool_calls"
    # message_delta's cumulative input counts replace message_start's
    assert translator.usage == Usage(input_tokens=1496, cached_input_tokens=1024, output_tokens=89)
    final = accumulate(chunks)
    message = final.choices[0].message
    assert message.content == "Checking both cities."
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(c.id, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", {"location": "San Francisco, CA", "unit": "celsius"}),
        ("toolu_01VfdkQVz2jDyhrZ7kW6gTpR", {"location": "Paris"}),
    ]


def feed_all(translator: StreamTranslator, events: list[JSON]) -> list[JSON]:
    chunks = []
    for event in events:
        chunks.extend(translator.feed(SSEEvent(str(event["type"]), json.dumps(event))))
    return chunks


START: JSON = {
    "type": "message_start",
    "message": {"id": "m", "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}},
}


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, Outcome.OVERLOAD),
        ({"type": "api_error", "message": "Internal"}, Outcome.PROVIDER_ERROR),
        ({"type": "rate_limit_error", "message": "slow down"}, Outcome.CAPACITY),
        (
            {
                "type": "rate_limit_error",
                "message": "spend",
                "details": {"error_code": "enforced_spend_limit_reached"},
            },
            Outcome.POLICY,
        ),
        ({"type": "invalid_request_error", "message": "bad"}, Outcome.REQUEST_ERROR),
        ({"type": "brand_new_error", "message": "?"}, Outcome.PROVIDER_ERROR),
        (None, Outcome.PROVIDER_ERROR),
    ],
)
def test_it_raises_classified_stream_errors(error: Any, outcome: Outcome) -> None:
    translator = new_translator()
    feed_all(translator, [START])
    with pytest.raises(StreamError) as caught:
        feed_all(translator, [{"type": "error", "error": error}])
    assert caught.value.classified.outcome is outcome
    assert translator.usage == Usage(input_tokens=10, output_tokens=1)  # partial usage survives
    assert not translator.done


def test_it_ignores_pings_thinking_and_unknown_events() -> None:
    translator = new_translator()
    chunks = feed_all(
        translator,
        [
            START,
            {"type": "ping"},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta"}},
            {"type": "content_block_stop", "index": 0},
            {"type": "brand_new_event", "x": 1},
            {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {}},
            {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {}},
        ],
    )
    assert len(chunks) == 2  # role chunk, one finish chunk despite two message_delta events
    assert chunks[1]["choices"][0]["finish_reason"] == "length"
    assert not translator.done


@pytest.mark.parametrize(
    "event",
    [
        SSEEvent("message_start", "{not json"),
        SSEEvent("message_start", "[]"),
        SSEEvent("message_start", '{"type": "message_start"}'),
        SSEEvent("content_block_delta", '{"type": "content_block_delta", "index": 0}'),
    ],
)
def test_it_raises_for_malformed_events(event: SSEEvent) -> None:
    with pytest.raises(StreamError) as caught:
        new_translator().feed(event)
    assert caught.value.classified.outcome is Outcome.PROVIDER_ERROR


def test_it_reads_anthropic_rate_limit_headers_and_retry_after() -> None:
    info = ADAPTER.rate_limits(
        {
            "Retry-After": "17",
            "Anthropic-RateLimit-Output-Tokens-Remaining": "0",
            "anthropic-ratelimit-output-tokens-reset": "2025-06-15T15:07:00Z",
            "anthropic-ratelimit-requests-limit": "many",
            "anthropic-ratelimit-requests-reset": "yesterday",
        },
        now=1_750_000_000.0,  # 2025-06-15T15:06:40Z
    )
    assert info.retry_after == 17.0
    assert [(o.dimension, o.limit, o.remaining, o.reset_after) for o in info.observations] == [
        ("output_tokens", None, 0.0, 20.0)
    ]
    assert ADAPTER.rate_limits({}, now=0.0).observations == ()


LEAVES = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
EVENT_TYPES = st.sampled_from(
    [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    ]
)
RANDOM_EVENTS = st.fixed_dictionaries(
    {"type": EVENT_TYPES},
    optional={
        "index": st.integers(0, 3) | JSON_VALUES,
        "message": JSON_VALUES,
        "content_block": st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "tool_use"])},
            optional={
                "id": JSON_VALUES,
                "name": JSON_VALUES,
                "text": JSON_VALUES,
                "input": JSON_VALUES,
            },
        )
        | JSON_VALUES,
        "delta": st.fixed_dictionaries(
            {"type": st.sampled_from(["text_delta", "input_json_delta"])},
            optional={"text": JSON_VALUES, "partial_json": JSON_VALUES, "stop_reason": JSON_VALUES},
        )
        | JSON_VALUES,
        "usage": st.dictionaries(
            st.sampled_from(["input_tokens", "output_tokens", "cache_read_input_tokens"]), LEAVES
        )
        | JSON_VALUES,
        "error": JSON_VALUES,
    },
)


@settings(max_examples=150)
@given(st.lists(RANDOM_EVENTS, max_size=8))
def test_it_translates_or_raises_stream_error_but_never_crashes(events: list[JSON]) -> None:
    translator = new_translator()
    try:
        chunks = feed_all(translator, events)
    except StreamError as error:
        assert isinstance(error.classified.outcome, Outcome)
        return
    for chunk in chunks:
        ChatCompletionChunk.model_validate_json(json.dumps(chunk))  # servable and well-typed
