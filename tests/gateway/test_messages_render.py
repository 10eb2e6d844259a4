"""The Messages door's answers, streams and error envelope, read back with the anthropic SDK's
own types and stream accumulator (what a client would make of them)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from gateway.doors.base import Rendering
from gateway.doors.messages import MESSAGES_DOOR, error_envelope
from gateway.errors import (
    AuthenticationFailed,
    BodyTooLarge,
    CapacityRefused,
    InternalError,
    InvalidRequest,
    PermissionDenied,
    ServiceUnavailable,
    UnknownModel,
    UpstreamError,
    UpstreamOverloaded,
    UpstreamQuotaExhausted,
    UpstreamTimeout,
)
from gateway.providers.base import Completion, SSEEvent, SSEParser, Usage

EVENTS = TypeAdapter(RawMessageStreamEvent)
HOW = Rendering(
    call_id="gen-123", model="acme/chat-large", created=1, provider="alpha", cost=lambda u: 0.0
)
PASS = Rendering(
    call_id="gen-456",
    model="acme/chat-large",
    created=1,
    provider="beta",
    cost=lambda u: 0.0,
    passthrough=True,
)


def canonical(**fields: Any):
    body = {
        "model": "acme/chat-large",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    return MESSAGES_DOOR.parse(orjson.dumps({**body, **fields}), {})


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    return [(e.event, json.loads(e.data)) for e in SSEParser().feed(raw)]


def accumulated(raw: bytes):
    snapshot, bufs = None, {}
    for name, data in events_of(raw):
        assert name == data["type"], "each event is named by its data's type"
        if name in ("ping", "error"):
            continue
        snapshot = accumulate_event(
            event=EVENTS.validate_python(data), current_snapshot=snapshot, json_bufs=bufs
        )
    return snapshot


def render(chunks: list[list[dict[str, Any]]], usage: Usage | None, finish: str) -> bytes:
    renderer = MESSAGES_DOOR.stream_renderer(canonical(stream=True), HOW)
    event = SSEEvent("message", "{}")
    out = b"".join(renderer.feed(event, c) for c in chunks)
    return out + asyncio.run(renderer.close(usage, finish))


def test_a_chat_answer_becomes_an_anthropic_message():
    completion = Completion(
        body={
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "Checking.",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ]
        },
        usage=Usage(input_tokens=40, cached_input_tokens=10, output_tokens=7),
        finish_reason="tool_calls",
    )
    body = asyncio.run(MESSAGES_DOOR.answer(canonical(), completion, completion.usage, HOW))
    message = Message.model_validate(body)
    assert (message.id, message.model, message.stop_reason) == (
        "gen-123",
        "acme/chat-large",
        "tool_use",
    )
    assert message.content[0].type == "text" and message.content[0].text == "Checking."
    tool = message.content[1]
    assert (tool.type, tool.id, tool.name, tool.input) == (
        "tool_use",
        "call_1",
        "get_weather",
        {"city": "Oslo"},
    )
    # Anthropic's input_tokens exclude cache reads; ours include them.
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (30, 10)
    assert message.usage.output_tokens == 7


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("content_filter", "refusal"),
        ("", "end_turn"),
    ],
)
def test_finish_reasons_become_stop_reasons(finish, stop):
    completion = Completion(
        body={"choices": [{"message": {"role": "assistant", "content": "x"}}]},
        usage=None,
        finish_reason=finish,
    )
    body = asyncio.run(MESSAGES_DOOR.answer(canonical(), completion, Usage(1, 0, 1), HOW))
    assert body["stop_reason"] == stop


def test_a_provider_that_spoke_anthropic_has_its_body_passed_through_under_our_id():
    native = {
        "id": "msg_upstream",
        "type": "message",
        "role": "assistant",
        "model": "claude-upstream",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "Hello"},
        ],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "cache_creation_input_tokens": 100, "output_tokens": 3},
    }
    completion = Completion(body={}, usage=Usage(105, 0, 3), finish_reason="stop", native=native)
    body = asyncio.run(MESSAGES_DOOR.answer(canonical(), completion, completion.usage, PASS))
    assert body == {**native, "id": "gen-456", "model": "acme/chat-large"}


def test_a_text_stream_is_the_anthropic_event_sequence_and_the_sdk_reassembles_it():
    raw = render(
        [
            [chunk({"role": "assistant", "content": ""})],
            [chunk({"content": "Hel"}), chunk({"content": "lo"})],
            [chunk({}, "stop")],
            [{"choices": [], "usage": {"prompt_tokens": 12}}],  # the usage chunk: no block
        ],
        Usage(input_tokens=12, output_tokens=2),
        "stop",
    )
    names = [name for name, _ in events_of(raw)]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    message = accumulated(raw)
    assert message.id == "gen-123" and message.model == "acme/chat-large"
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == "Hello"
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 2)


def test_a_streamed_tool_call_becomes_a_tool_use_block_with_json_deltas():
    raw = render(
        [
            [chunk({"content": "Looking."})],
            [
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_7",
                                "function": {"name": "get_weather", "arguments": ""},
                            }
                        ]
                    }
                )
            ],
            [chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]})],
            [chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty":"Oslo"}'}}]})],
            [
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "call_8",
                                "function": {"name": "get_time", "arguments": "{}"},
                            }
                        ]
                    }
                )
            ],
            [chunk({}, "tool_calls")],
        ],
        Usage(input_tokens=20, output_tokens=9),
        "tool_calls",
    )
    message = accumulated(raw)
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    first, second = message.content[1], message.content[2]
    assert (first.id, first.name, first.input) == ("call_7", "get_weather", {"city": "Oslo"})
    assert (second.id, second.name, second.input) == ("call_8", "get_time", {})
    assert message.stop_reason == "tool_use"
    stops = [data["index"] for name, data in events_of(raw) if name == "content_block_stop"]
    assert stops == [0, 1, 2], "each block is closed, in order"


def test_a_stream_without_reported_usage_ends_with_the_estimate():
    request = canonical(stream=True)
    renderer = MESSAGES_DOOR.stream_renderer(request, HOW)
    raw = renderer.feed(SSEEvent("message", "{}"), [chunk({"content": "x"})])
    raw += asyncio.run(renderer.close(None, "length"))
    message = accumulated(raw)
    assert message.usage.input_tokens == request.estimate.input_tokens
    assert message.stop_reason == "max_tokens"


def test_a_broken_stream_ends_with_an_anthropic_error_event():
    renderer = MESSAGES_DOOR.stream_renderer(canonical(stream=True), HOW)
    raw = renderer.feed(SSEEvent("message", "{}"), [chunk({"content": "x"})])
    raw += renderer.fail(UpstreamTimeout("The provider stopped sending."))
    name, data = events_of(raw)[-1]
    assert name == "error"
    assert data == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "The provider stopped sending."},
    }


def test_an_anthropic_providers_events_pass_through_with_our_id_and_model_name():
    upstream = [
        SSEEvent("message_start", json.dumps({"type": "message_start", "message": {
            "id": "msg_up", "type": "message", "role": "assistant", "model": "claude-upstream",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 9, "cache_read_input_tokens": 4, "output_tokens": 1}}})),
        SSEEvent("content_block_start", json.dumps({"type": "content_block_start", "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""}})),
        SSEEvent("content_block_delta", json.dumps({"type": "content_block_delta", "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Let me see."}})),
        SSEEvent("content_block_delta", json.dumps({"type": "content_block_delta", "index": 0,
            "delta": {"type": "signature_delta", "signature": "c2ln"}})),
        SSEEvent("content_block_stop", json.dumps({"type": "content_block_stop", "index": 0})),
        SSEEvent("content_block_start", json.dumps({"type": "content_block_start", "index": 1,
            "content_block": {"type": "text", "text": ""}})),
        SSEEvent("content_block_delta", json.dumps({"type": "content_block_delta", "index": 1,
            "delta": {"type": "text_delta", "text": "Hi"}})),
        SSEEvent("content_block_stop", json.dumps({"type": "content_block_stop", "index": 1})),
        SSEEvent("message_delta", json.dumps({"type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 6}})),
        SSEEvent("message_stop", json.dumps({"type": "message_stop"})),
    ]  # fmt: skip
    renderer = MESSAGES_DOOR.stream_renderer(canonical(stream=True), PASS)
    raw = b"".join(renderer.feed(event, []) for event in upstream)
    raw += asyncio.run(renderer.close(Usage(13, 4, 6), "stop"))
    sent = events_of(raw)
    assert [name for name, _ in sent] == [e.event for e in upstream]
    assert sent[1:] == [(e.event, json.loads(e.data)) for e in upstream[1:]], "as they came"
    message = accumulated(raw)
    assert (message.id, message.model) == ("gen-456", "acme/chat-large")
    assert message.content[0].type == "thinking" and message.content[0].signature == "c2ln"
    assert message.usage.cache_read_input_tokens == 4 and message.usage.output_tokens == 6


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (AuthenticationFailed("who?"), 401, "authentication_error"),
        (PermissionDenied("no"), 403, "permission_error"),
        (UnknownModel("none"), 404, "not_found_error"),
        (BodyTooLarge("big"), 413, "request_too_large"),
        (
            CapacityRefused("slow down", reason="tenant_tokens", retry_after=3),
            429,
            "rate_limit_error",
        ),
        (UpstreamOverloaded("busy", reason="upstream_overload"), 529, "overloaded_error"),
        (UpstreamQuotaExhausted("spent", reason="upstream_policy"), 529, "overloaded_error"),
        (ServiceUnavailable("away"), 529, "overloaded_error"),
        (UpstreamError("garbage"), 502, "api_error"),
        (UpstreamTimeout("slow"), 504, "timeout_error"),
        (InternalError("bug"), 500, "api_error"),
    ],
)
def test_errors_take_anthropics_status_codes_and_types(error, status, kind):
    response = MESSAGES_DOOR.error_response(error, {"x-request-id": "gen-1", "retry-after": "3"})
    assert response.status_code == status
    body = orjson.loads(response.content)
    assert body == {
        "type": "error",
        "error": {
            "type": kind,
            "message": error.message,
            "code": error.code,
            "reason": error.reason,
        },
        "request_id": "gen-1",
    }
    assert response["retry-after"] == "3"
    assert response["content-type"] == "application/json"


def test_the_envelope_names_the_offending_field():
    envelope = error_envelope(InvalidRequest("max_tokens: must be…", param="max_tokens"))
    assert envelope["error"]["param"] == "max_tokens" and "request_id" not in envelope
