"""The Messages door's contract and its translation to the common (chat-completions) form."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from gateway.doors.messages import MESSAGES_DOOR, count_tokens_parse
from gateway.doors.messages_request import chat_body, messages_validate
from gateway.errors import BodyTooLarge, InvalidRequest
from gateway.providers.anthropic import AnthropicAdapter
from gateway.providers.anthropic_request import messages_request
from quotas.core.estimate import request_estimate

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def request(**fields: Any) -> dict[str, Any]:
    return {
        "model": "acme/chat-large",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Hello"}],
        **fields,
    }


def parse(body: dict[str, Any], headers: dict[str, str] | None = None):
    return MESSAGES_DOOR.parse(orjson.dumps(body), headers or {})


def test_a_plain_request_becomes_a_chat_body_with_its_output_limit():
    body = chat_body(request(temperature=0.3, top_p=0.9, stop_sequences=["END"]))
    assert body == {
        "model": "acme/chat-large",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 256,
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["END"],
    }


def test_system_as_a_string_or_as_blocks_leads_the_messages():
    assert chat_body(request(system="Be brief."))["messages"][0] == {
        "role": "system",
        "content": "Be brief.",
    }
    blocks = [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "Tools follow.", "cache_control": {"type": "ephemeral"}},
    ]
    system = chat_body(request(system=blocks))["messages"][0]
    assert system["role"] == "system"
    assert system["content"] == [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "Tools follow.", "cache_control": {"type": "ephemeral"}},
    ]


def test_images_become_image_url_parts():
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
        {"type": "text", "text": "What is this?"},
    ]
    [message] = chat_body(request(messages=[{"role": "user", "content": content}]))["messages"]
    assert message["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
        {"type": "text", "text": "What is this?"},
    ]


def tool_conversation() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Call the tool.", "signature": "sig"},
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Here you are."},
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            ],
        },
    ]


def test_tool_use_becomes_tool_calls_and_tool_results_come_first_as_tool_messages():
    messages = chat_body(request(messages=tool_conversation(), tools=[WEATHER]))["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": "Let me look.",  # the thinking block has no chat form
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "user", "content": "Here you are."},
    ]


def test_a_failed_tool_result_says_so_and_block_content_is_flattened_to_text():
    content = [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_9",
            "is_error": True,
            "content": [{"type": "text", "text": "city unknown"}],
        }
    ]
    messages = chat_body(request(messages=[{"role": "user", "content": content}]))["messages"]
    assert messages == [
        {"role": "tool", "tool_call_id": "toolu_9", "content": "Error: city unknown"}
    ]


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
            None,
        ),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ],
)
def test_tools_and_tool_choice_become_function_tools(choice, expected, parallel):
    server_tool = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    body = chat_body(request(tools=[WEATHER, server_tool], tool_choice=choice))
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": "Current weather in a city",
            },
        }
    ]  # the server tool only Anthropic can run
    assert body["tool_choice"] == expected
    assert body.get("parallel_tool_calls") == parallel


def test_the_common_form_translates_back_to_the_same_anthropic_conversation():
    """Messages → chat → Messages (the Anthropic adapter) keeps what both forms can say."""
    native = request(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=tool_conversation(),
        tools=[WEATHER],
        tool_choice={"type": "any"},
        stop_sequences=["END"],
        metadata={"user_id": "user_abc_session_1"},
    )
    back = messages_request(chat_body(native), upstream_model="m", stream=False, max_output=9)
    assert back["system"] == "Be brief."
    assert back["max_tokens"] == 256
    assert back["tool_choice"] == {"type": "any"}
    assert back["stop_sequences"] == ["END"]
    assert back["metadata"] == {"user_id": "user_abc_session_1"}
    assert back["messages"][1]["content"][1] == native["messages"][1]["content"][2]
    assert back["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
        {"type": "text", "text": "Here you are."},
    ]


def test_the_canonical_request_carries_session_features_headers_and_one_estimate():
    body = request(
        stream=True,
        tools=[WEATHER],
        metadata={"user_id": "user_1_session_x"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        provider={"only": ["beta"]},
    )
    canonical = parse(body, {"Anthropic-Beta": "prompt-caching-2024-07-31", "X-Other": "no"})
    assert canonical.door is MESSAGES_DOOR
    assert canonical.model == "acme/chat-large"
    assert canonical.stream is True
    assert canonical.session_id == canonical.user == "user_1_session_x"
    assert canonical.features == frozenset({"stream", "tools"})
    assert canonical.preferences.only == ("beta",)
    assert dict(canonical.headers) == {"anthropic-beta": "prompt-caching-2024-07-31"}
    assert canonical.estimate == request_estimate(canonical.body)
    assert canonical.estimate.max_output == 256
    # The native body goes to Anthropic as it came, minus Switchyard's own fields.
    assert "provider" not in canonical.native
    assert canonical.native["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_a_session_header_wins_over_metadata():
    canonical = parse(request(metadata={"user_id": "u"}), {"x-session-id": "s-1"})
    assert canonical.session_id == "s-1"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"model": 5}, "model"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": 5}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}],
                    }
                ]
            },
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "text/html", "data": ""},
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].source.media_type",
        ),
        ({"system": 4}, "system"),
        ({"system": [{"type": "image"}]}, "system[0]"),
        ({"tools": [{"name": "t"}]}, "tools[0].input_schema"),
        ({"tool_choice": {"type": "required"}}, "tool_choice"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"temperature": 1.5}, "temperature"),
        ({"stream": "yes"}, "stream"),
        ({"metadata": {"user_id": 7}}, "metadata.user_id"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"provider": {"only": "beta"}}, "provider"),
        ({"models": ["acme/chat-small"] * 9}, "models"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(change, param):
    with pytest.raises(InvalidRequest) as refused:
        parse(request(**change))
    assert refused.value.status == 400
    assert refused.value.param == param
    assert refused.value.message.startswith(param)


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'"x"'])
def test_a_body_that_is_no_json_object_is_refused(raw):
    with pytest.raises(InvalidRequest) as refused:
        MESSAGES_DOOR.parse(raw, {})
    assert refused.value.code == "invalid_json"


def test_a_deep_or_large_body_is_refused():
    deep: Any = "x"
    for _ in range(70):
        deep = [deep]
    with pytest.raises(InvalidRequest) as refused:
        parse(request(metadata={"user_id": "u", "deep": deep}))
    assert refused.value.param == "metadata"
    with pytest.raises(BodyTooLarge):
        MESSAGES_DOOR.__class__(max_bytes=100).parse(orjson.dumps(request(system="x" * 200)), {})


def test_validation_keeps_unknown_fields_for_anthropic():
    body = request(service_tier="auto", container="c1")
    assert messages_validate(body) is body


def test_count_tokens_is_the_estimate_the_broker_reserves_by():
    body = request(system="You are terse.", tools=[WEATHER])
    del body["max_tokens"]  # count_tokens takes none
    model, tokens = count_tokens_parse(orjson.dumps(body), max_bytes=1 << 20)
    assert model == "acme/chat-large"
    assert tokens == request_estimate(chat_body({**body, "max_tokens": 1})).input_tokens
    longer = {**body, "system": "You are terse. " * 100}
    assert count_tokens_parse(orjson.dumps(longer), max_bytes=1 << 20)[1] > tokens + 300


def test_the_native_request_goes_to_anthropic_with_its_own_fields_and_betas():
    native = request(
        system=[{"type": "text", "text": "Long prompt", "cache_control": {"type": "ephemeral"}}],
        thinking={"type": "enabled", "budget_tokens": 2048},
        stream=True,
    )
    wire = AnthropicAdapter().build_native_request(
        native,
        upstream_model="claude-upstream",
        api_key="sk-ant",
        stream=False,  # a deferred job: the gateway decides
        max_output=8192,
        headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    assert wire.path == "/v1/messages"
    assert wire.headers["x-api-key"] == "sk-ant"
    assert wire.headers["anthropic-version"] == "2023-06-01"
    assert wire.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert wire.json == {
        **{k: v for k, v in native.items() if k != "stream"},
        "model": "claude-upstream",
    }
    assert native["model"] == "acme/chat-large", "the client's body is not changed"
    streamed = AnthropicAdapter().build_native_request(
        native, upstream_model="u", api_key="k", stream=True, max_output=1, headers={}
    )
    assert streamed.json["stream"] is True and "anthropic-beta" not in streamed.headers
    json.dumps(streamed.json)  # plain JSON, ready to send


def test_claude_codes_request_shape_is_accepted():
    """What Claude Code 2.1 sends: a system turn among the messages, adaptive thinking,
    fields newer than this gateway (context_management, output_config), its session header."""
    body = request(
        system=[
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": "Available agent types: …"},
        ],
        thinking={"type": "adaptive"},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "high"},
        metadata={"user_id": '{"device_id":"d","session_id":"s-meta"}'},
        max_tokens=32000,
        stream=True,
    )
    canonical = parse(body, {"X-Claude-Code-Session-Id": "s-header"})
    assert canonical.session_id == "s-header"
    assert [m["role"] for m in canonical.body["messages"]] == ["system", "user", "system"]
    assert canonical.body["messages"][2]["content"] == "Available agent types: …"
    assert canonical.native["context_management"] == body["context_management"]
    with pytest.raises(InvalidRequest) as refused:
        parse(request(messages=[{"role": "system", "content": [{"type": "image"}]}]))
    assert refused.value.param == "messages[0].content[0]"


def test_documents_become_file_or_text_parts_and_text_blocks_stay_separate_lines():
    content = [
        {
            "type": "document",
            "title": "report.pdf",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"},
        },
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "notes"},
        },
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
        {"type": "text", "text": "Summarise."},
    ]
    [message] = chat_body(request(messages=[{"role": "user", "content": content}]))["messages"]
    assert message["content"] == [
        {
            "type": "file",
            "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"},
        },
        {"type": "text", "text": "notes"},
        {"type": "text", "text": "Summarise."},
    ]
    two = [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "hi"}]
    [message] = chat_body(request(messages=[{"role": "user", "content": two}]))["messages"]
    assert message["content"] == "<reminder>\nhi"


def test_block_types_only_anthropic_knows_go_to_it_and_stay_out_of_the_common_form():
    content = [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {}},
        {"type": "text", "text": "Found it."},
    ]
    body = request(
        messages=[{"role": "user", "content": "?"}, {"role": "assistant", "content": content}]
    )
    canonical = parse(body)
    assert canonical.native["messages"][1]["content"] == content
    assert canonical.body["messages"][1] == {"role": "assistant", "content": "Found it."}
