"""OpenAI-compatible adapter: request pass-through, response and stream rewriting, headers."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.providers.base import (
    JSON,
    LimitObservation,
    Outcome,
    SSEEvent,
    StreamError,
    StreamTranslator,
    Usage,
)
from gateway.providers.openai import GATEWAY_ONLY_FIELDS, OpenAIAdapter

ADAPTER = OpenAIAdapter()
NOW = 1_750_000_000.0

BODY: JSON = {
    "model": "acme/chat-large:floor",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0.2,
    "provider": {"order": ["alpha"], "allow_fallbacks": False},
    "models": ["acme/chat-large", "acme/chat-small"],
    "route": "fallback",
    "transforms": ["middle-out"],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
}


def build(body: JSON, *, stream: bool) -> JSON:
    request = ADAPTER.build_request(
        body, upstream_model="chat-large", api_key="sk-up", stream=stream, max_output=4096
    )
    assert request.path == "/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-up"
    return request.json


def test_it_strips_gateway_fields_and_names_the_upstream_model() -> None:
    original = copy.deepcopy(BODY)
    wire = build(BODY, stream=False)
    assert wire == {
        "model": "chat-large",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "tools": BODY["tools"],
    }
    assert original == BODY  # the canonical body is not mutated
    assert {"provider", "models", "route", "transforms"} <= GATEWAY_ONLY_FIELDS


def test_it_does_not_invent_max_tokens() -> None:
    assert "max_tokens" not in build(BODY, stream=False)
    assert "max_completion_tokens" not in build(BODY, stream=True)
    assert build({**BODY, "max_tokens": 77}, stream=False)["max_tokens"] == 77


@pytest.mark.parametrize(
    "client_options",
    [None, {"include_usage": False}, {"include_usage": True}, {"include_obfuscation": False}],
)
def test_it_forces_usage_in_upstream_streams(client_options: Any) -> None:
    body = {**BODY, "stream": True}
    if client_options is not None:
        body["stream_options"] = client_options
    wire = build(body, stream=True)
    assert wire["stream"] is True
    assert wire["stream_options"]["include_usage"] is True
    if client_options and "include_obfuscation" in client_options:
        assert wire["stream_options"]["include_obfuscation"] is False


def test_it_drops_stream_options_when_not_streaming() -> None:
    wire = build({**BODY, "stream": False, "stream_options": {"include_usage": True}}, stream=False)
    assert "stream" not in wire and "stream_options" not in wire


COMPLETION: JSON = {
    "id": "chatcmpl-upstream",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "chat-large-2025-01-01",
    "system_fingerprint": "fp_1",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {
        "prompt_tokens": 120,
        "completion_tokens": 18,
        "total_tokens": 138,
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 0},
    },
}


def test_it_parses_a_completion_with_the_gateways_id_and_model() -> None:
    completion = ADAPTER.parse_completion(COMPLETION, response_id="gen-1", model="acme/chat-large")
    assert completion.body["id"] == "gen-1"
    assert completion.body["model"] == "acme/chat-large"
    assert completion.body["choices"] == COMPLETION["choices"]
    assert completion.body["created"] == 1700000000
    assert completion.usage == Usage(input_tokens=120, cached_input_tokens=64, output_tokens=18)
    assert completion.finish_reason == "tool_calls"
    ChatCompletion.model_validate(completion.body)
    created = ADAPTER.parse_completion(COMPLETION, response_id="g", model="m", created=5)
    assert created.body["created"] == 5


def test_it_reports_no_usage_rather_than_zero() -> None:
    body = {k: v for k, v in COMPLETION.items() if k != "usage"}
    assert ADAPTER.parse_completion(body, response_id="g", model="m").usage is None


@pytest.mark.parametrize(
    ("data", "outcome"),
    [
        ({"error": {"message": "boom", "type": "server_error"}}, Outcome.PROVIDER_ERROR),
        ({"error": {"message": "quota", "code": "insufficient_quota"}}, Outcome.POLICY),
        ({"object": "chat.completion"}, Outcome.PROVIDER_ERROR),
        ({"choices": ["not a dict"]}, Outcome.PROVIDER_ERROR),
    ],
)
def test_it_raises_for_error_or_malformed_2xx_bodies(data: JSON, outcome: Outcome) -> None:
    with pytest.raises(StreamError) as caught:
        ADAPTER.parse_completion(data, response_id="g", model="m")
    assert caught.value.classified.outcome is outcome


def new_translator() -> StreamTranslator:
    return ADAPTER.stream_translator(response_id="gen-9", model="acme/chat-large", created=42)


def test_it_passes_stream_chunks_through_and_keeps_usage(
    recorded: Callable[[str], bytes], replay: Callable[[StreamTranslator, bytes], list[JSON]]
) -> None:
    translator = new_translator()
    chunks = replay(translator, recorded("openai_tools.sse"))
    assert len(chunks) == 5
    assert {(c["id"], c["model"], c["created"]) for c in chunks} == {
        ("gen-9", "acme/chat-large", 42)
    }
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 138
    assert translator.done
    assert translator.finish_reason == "tool_calls"
    assert translator.usage == Usage(input_tokens=120, cached_input_tokens=64, output_tokens=18)
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    final = state.get_final_completion()
    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert json.loads(call.function.arguments) == {"location": "Paris"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        ({"message": "Rate limit reached", "code": "rate_limit_exceeded"}, Outcome.CAPACITY),
        (
            {"message": "You exceeded your current quota", "type": "insufficient_quota"},
            Outcome.POLICY,
        ),
        ({"message": "upstream overloaded", "code": 503}, Outcome.OVERLOAD),
        ({"message": "Provider returned error", "code": 502}, Outcome.PROVIDER_ERROR),
        ({"message": "weird"}, Outcome.PROVIDER_ERROR),
        ("plain text error", Outcome.PROVIDER_ERROR),
    ],
)
def test_it_raises_stream_error_for_an_error_chunk(error: Any, outcome: Outcome) -> None:
    translator = new_translator()
    with pytest.raises(StreamError) as caught:
        translator.feed(SSEEvent("message", json.dumps({"error": error})))
    assert caught.value.classified.outcome is outcome
    assert caught.value.classified.message


@pytest.mark.parametrize("data", ["{not json", "[1, 2]", '"text"'])
def test_it_raises_stream_error_for_garbage_events(data: str) -> None:
    with pytest.raises(StreamError) as caught:
        new_translator().feed(SSEEvent("message", data))
    assert caught.value.classified.outcome is Outcome.PROVIDER_ERROR


def test_it_reads_openai_rate_limit_headers() -> None:
    info = ADAPTER.rate_limits(
        {
            "X-RateLimit-Limit-Requests": "60",
            "x-ratelimit-limit-tokens": "150000",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-remaining-tokens": "149984",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-reset-tokens": "6m0s",
            "retry-after": "2",
        },
        now=NOW,
    )
    assert info.observations == (
        LimitObservation("requests", 60.0, 59.0, 1.0),
        LimitObservation("tokens", 150000.0, 149984.0, 360.0),
    )
    assert info.retry_after == 2.0


def test_it_reads_azure_style_headers() -> None:
    info = ADAPTER.rate_limits(
        {
            "x-ratelimit-remaining-requests": "19",
            "x-ratelimit-remaining-tokens": "-1",  # seen on Azure; meaningless
            "x-ratelimit-reset-tokens": "42",
            "retry-after-ms": "1500",
            "retry-after": "2",
        },
        now=NOW,
    )
    assert info.observations == (
        LimitObservation("requests", None, 19.0, None),
        LimitObservation("tokens", None, None, 42.0),
    )
    assert info.retry_after == 1.5


def test_it_skips_garbled_or_missing_headers() -> None:
    garbled = {
        "x-ratelimit-limit-requests": "lots",
        "x-ratelimit-reset-requests": "soon",
        "x-ratelimit-reset-tokens": "6m0",
        "retry-after": "whenever",
    }
    assert ADAPTER.rate_limits(garbled, now=NOW).observations == ()
    assert ADAPTER.rate_limits(garbled, now=NOW).retry_after is None
    assert ADAPTER.rate_limits({}, now=NOW).observations == ()
