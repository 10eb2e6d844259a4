"""OpenAI chat request → Anthropic Messages request, checked against the anthropic SDK's types."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from anthropic.types import (
    Base64ImageSourceParam,
    ImageBlockParam,
    TextBlockParam,
    ToolChoiceAnyParam,
    ToolChoiceAutoParam,
    ToolChoiceNoneParam,
    ToolChoiceToolParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
    URLImageSourceParam,
)
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming as _NonStreaming
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.providers.anthropic import AnthropicAdapter
from gateway.providers.anthropic_request import tool_input
from gateway.providers.base import JSON, RequestNotSupported

ADAPTER = AnthropicAdapter()

BLOCK_TYPES: dict[str, Any] = {
    "text": TextBlockParam,
    "image": ImageBlockParam,
    "tool_use": ToolUseBlockParam,
    "tool_result": ToolResultBlockParam,
}
CHOICE_TYPES: dict[str, Any] = {
    "auto": ToolChoiceAutoParam,
    "any": ToolChoiceAnyParam,
    "tool": ToolChoiceToolParam,
    "none": ToolChoiceNoneParam,
}
SOURCE_TYPES: dict[str, Any] = {"url": URLImageSourceParam, "base64": Base64ImageSourceParam}


# anthropic 2.14 no longer types temperature / top_p (newer models reject temperature), but the
# API still takes them for the models that do; the brief asks for both.
LEGACY_SAMPLING = frozenset({"temperature", "top_p"})


def required_keys(typed_dict: Any) -> set[str]:
    """The SDK's ``Required[...]`` keys (its string annotations hide them from the runtime)."""
    return {
        name
        for klass in typed_dict.__mro__
        for name, hint in getattr(klass, "__annotations__", {}).items()
        if getattr(hint, "__forward_arg__", str(hint)).startswith("Required[")
    }


def assert_shape(value: JSON, typed_dict: Any, extra: frozenset[str] = frozenset()) -> None:
    """Every required key of the SDK's TypedDict is present and no unknown key is sent."""
    keys = set(value)
    assert required_keys(typed_dict) <= keys, (typed_dict.__name__, value)
    assert keys <= typed_dict.__optional_keys__ | typed_dict.__required_keys__ | extra, value


def assert_valid_anthropic(wire: JSON) -> None:
    top_level = MessageCreateParamsStreaming if wire.get("stream") else _NonStreaming
    assert_shape(wire, top_level, LEGACY_SAMPLING)
    roles = [m["role"] for m in wire["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    for message in wire["messages"]:
        assert set(message) == {"role", "content"} and message["content"]
        for block in message["content"]:
            assert_shape(block, BLOCK_TYPES[block["type"]])
            if block["type"] == "image":
                assert_shape(block["source"], SOURCE_TYPES[block["source"]["type"]])
    for tool in wire.get("tools", []):
        assert_shape(tool, ToolParam)
    if "tool_choice" in wire:
        assert_shape(wire["tool_choice"], CHOICE_TYPES[wire["tool_choice"]["type"]])


def build(body: JSON, *, stream: bool = False, max_output: int = 4096) -> JSON:
    original = copy.deepcopy(body)
    request = ADAPTER.build_request(
        body,
        upstream_model="chat-large-fast",
        api_key="sk-ant",
        stream=stream,
        max_output=max_output,
    )
    assert body == original  # the canonical body is not mutated
    assert request.path == "/v1/messages"
    assert request.headers == {
        "x-api-key": "sk-ant",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    assert_valid_anthropic(request.json)
    return request.json


def user(content: Any) -> JSON:
    return {"role": "user", "content": content}


def text(value: str) -> JSON:
    return {"type": "text", "text": value}


def test_it_hoists_system_and_developer_messages() -> None:
    wire = build(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [text("Answer in French."), text("No emoji.")]},
                user("hi"),
                {"role": "system", "content": "Late instruction."},
            ]
        }
    )
    assert wire["system"] == "Be brief.\n\nAnswer in French.\nNo emoji.\n\nLate instruction."
    assert wire["messages"] == [user([text("hi")])]
    assert wire["model"] == "chat-large-fast"


def test_it_merges_consecutive_same_role_messages() -> None:
    wire = build(
        {
            "messages": [
                user("one"),
                user([text("two"), text("")]),  # empty text parts are dropped
                {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": ""},  # empty turn dropped
                {"role": "assistant", "content": [text("b")]},
                user("three"),
            ]
        }
    )
    assert wire["messages"] == [
        user([text("one"), text("two")]),
        {"role": "assistant", "content": [text("a"), text("b")]},
        user([text("three")]),
    ]


WEATHER_TOOL: JSON = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}


def test_it_translates_a_tool_round_trip_history() -> None:
    wire = build(
        {
            "messages": [
                user("Weather in Paris and Rome?"),
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        },
                        {
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "call_a", "content": "18C"},
                {"role": "tool", "tool_call_id": "call_b", "content": [text("21C")]},
                user("And tomorrow?"),
            ],
            "tools": [WEATHER_TOOL],
        }
    )
    assert wire["messages"] == [
        user([text("Weather in Paris and Rome?")]),
        {
            "role": "assistant",
            "content": [
                text("Checking."),
                {
                    "type": "tool_use",
                    "id": "call_a",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "call_b",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        user(
            [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": [text("21C")]},
                text("And tomorrow?"),
            ]
        ),
    ]
    assert wire["tools"] == [
        {
            "name": "get_weather",
            "description": "Current weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert "tool_choice" not in wire


def test_it_puts_tool_results_first_in_their_user_turn() -> None:
    wire = build(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                user("interjection"),
                {"role": "tool", "tool_call_id": "c1", "content": ""},
            ],
            "tools": [WEATHER_TOOL],
        }
    )
    assert wire["messages"][1]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1"},
        text("interjection"),
    ]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"city": "Paris"}', {"city": "Paris"}),
        ("", {}),
        ('{"city": "Par', {}),  # truncated generation
        ("[1, 2]", {}),  # valid JSON, not an object
        ("null", {}),
        (None, {}),
        ({"already": "parsed"}, {"already": "parsed"}),
    ],
)
def test_it_turns_tool_arguments_into_an_object(arguments: Any, expected: JSON) -> None:
    assert tool_input(arguments) == expected


@pytest.mark.parametrize(
    ("tool_choice", "parallel", "expected"),
    [
        (None, None, None),
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            None,
            {"type": "tool", "name": "get_weather"},
        ),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("none", False, {"type": "none"}),
        ("auto", True, {"type": "auto"}),
    ],
)
def test_it_maps_tool_choice(tool_choice: Any, parallel: Any, expected: JSON | None) -> None:
    body: JSON = {"messages": [user("hi")], "tools": [WEATHER_TOOL]}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    assert build(body).get("tool_choice") == expected


def test_it_drops_tool_choice_without_tools() -> None:
    wire = build({"messages": [user("hi")], "tool_choice": "required", "tools": []})
    assert "tool_choice" not in wire and "tools" not in wire


def test_it_translates_images() -> None:
    wire = build(
        {
            "messages": [
                user(
                    [
                        text("What is this?"),
                        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64,iVBORw0K", "detail": "low"},
                        },
                    ]
                )
            ]
        }
    )
    assert wire["messages"][0]["content"][1:] == [
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"},
        },
    ]


def test_it_keeps_cache_control_on_parts() -> None:
    marked = {**text("long context"), "cache_control": {"type": "ephemeral"}}
    wire = build({"messages": [user([marked])]})
    assert wire["messages"][0]["content"] == [marked]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"max_tokens": 4096}),
        ({"max_tokens": 300}, {"max_tokens": 300}),
        ({"max_completion_tokens": 200, "max_tokens": 300}, {"max_tokens": 200}),
        ({"max_tokens": 0}, {"max_tokens": 4096}),
        ({"temperature": 0.3, "top_p": 0.9}, {"temperature": 0.3, "top_p": 0.9}),
        ({"temperature": 1.7}, {"temperature": 1.0}),  # OpenAI's 0–2 clamped to Anthropic's 0–1
        ({"stop": "END"}, {"stop_sequences": ["END"]}),
        ({"stop": ["END", "", " ", "STOP"]}, {"stop_sequences": ["END", "STOP"]}),
        ({"user": "u-42"}, {"metadata": {"user_id": "u-42"}}),
        (
            {
                "frequency_penalty": 0.5,
                "presence_penalty": 0.1,
                "logit_bias": {"1": 2},
                "seed": 7,
                "n": 1,
                "response_format": {"type": "json_object"},
                "stream_options": {"include_usage": True},
                "metadata": {"team": "x"},
                "provider": {"order": ["beta"]},
                "models": ["a", "b"],
            },
            {},
        ),
    ],
)
def test_it_maps_sampling_fields_and_drops_the_rest(fields: JSON, expected: JSON) -> None:
    wire = build({"messages": [user("hi")], **fields})
    scalars = {k: v for k, v in wire.items() if k not in ("model", "messages")}
    assert scalars == {"max_tokens": 4096, **expected}


def test_it_sets_stream_when_streaming() -> None:
    assert build({"messages": [user("hi")]}, stream=True)["stream"] is True
    assert "stream" not in build({"messages": [user("hi")], "stream": True}, stream=False)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [user("hi")], "n": 2},
        {"messages": [user([{"type": "input_audio", "input_audio": {"data": "x"}}])]},
        {"messages": [user([{"type": "image_url", "image_url": {"url": "data:image/png,raw"}}])]},
        {"messages": [user("hi")], "tools": [{"type": "custom", "custom": {"name": "x"}}]},
        {"messages": [{"role": "tool", "content": "orphan"}]},
        {"messages": [{"role": "function", "name": "f", "content": "legacy"}]},
        {"messages": "hi"},
        {"messages": [{"role": "system", "content": "only a system prompt"}]},
        {"messages": [user("")]},  # Anthropic answers 400: messages: Field required
    ],
)
def test_it_refuses_what_anthropic_cannot_express(body: JSON) -> None:
    with pytest.raises(RequestNotSupported):
        ADAPTER.build_request(body, upstream_model="m", api_key="k", stream=False, max_output=100)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | JSON_VALUES
PARTS = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "refusal", "input_audio"])},
    optional={"text": JSON_VALUES, "image_url": JSON_VALUES, "cache_control": JSON_VALUES},
)
TEXT_PARTS = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=5)})
CALLS = st.fixed_dictionaries(
    {
        "id": st.text(min_size=1, max_size=3),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": st.text(min_size=1, max_size=3),
                "arguments": st.text(max_size=8) | st.just('{"a": 1}'),
            }
        ),
    }
)
MESSAGES = st.fixed_dictionaries(
    {"role": ROLES},
    optional={
        "content": st.none()
        | st.text(max_size=5)
        | st.lists(TEXT_PARTS, max_size=3)
        | st.lists(PARTS | JSON_VALUES, max_size=3),
        "tool_calls": st.lists(CALLS, max_size=2) | JSON_VALUES,
        "tool_call_id": st.text(max_size=3) | JSON_VALUES,
    },
)
TOOL_CHOICES = st.sampled_from(["auto", "none", "required", "any"]) | st.fixed_dictionaries(
    {"type": st.just("function")}, optional={"function": JSON_VALUES | st.just({"name": "f"})}
)
BODIES = st.fixed_dictionaries(
    {"messages": st.lists(MESSAGES, max_size=4) | JSON_VALUES},
    optional={
        "tools": st.just([WEATHER_TOOL]) | st.lists(JSON_VALUES, max_size=2),
        "tool_choice": TOOL_CHOICES | JSON_VALUES,
        **{
            key: JSON_VALUES
            for key in (
                "parallel_tool_calls",
                "max_tokens",
                "max_completion_tokens",
                "temperature",
                "top_p",
                "stop",
                "user",
                "n",
            )
        },
    },
)


@settings(max_examples=300)
@given(BODIES)
def test_it_translates_or_refuses_but_never_crashes(body: JSON) -> None:
    try:
        wire = ADAPTER.build_request(
            body, upstream_model="m", api_key="k", stream=False, max_output=64
        ).json
    except RequestNotSupported:
        return
    roles = [m["role"] for m in wire["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles))
    assert isinstance(wire["max_tokens"], int) and wire["max_tokens"] > 0
