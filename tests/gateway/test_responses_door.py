"""The Responses door's parse and answer: a Responses body in the common chat form and a chat
answer as a Response object (issue 16 item 3)."""

import asyncio
import json

import pytest

from gateway.doors.base import Rendering
from gateway.doors.responses import ResponsesDoor
from gateway.doors.responses_translate import assistant_message, output_items, response_id
from gateway.errors import InvalidRequest, NotFound, ServiceUnavailable
from gateway.providers.base import Completion, Usage
from gateway.response_store import StoredTurn
from gateway.responses_intake import previous_id_read
from routing.core.sticky import conversation_key

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
HOW = Rendering(
    call_id="gen-0123abcd",
    model="acme/chat-large",
    created=1_700_000_000,
    provider="alpha",
    cost=lambda usage: usage.total_tokens / 1000,
)


def parse(body, *, door=None, headers=None):
    return (door or ResponsesDoor()).parse(json.dumps(body).encode(), headers or {})


def test_it_reads_a_string_input_with_instructions_as_system_then_user():
    request = parse(
        {
            "model": "acme/chat-large",
            "input": "Hello!",
            "instructions": "Be brief.",
            "max_output_tokens": 50,
            "temperature": 0.2,
        }
    )

    assert request.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello!"},
    ]
    assert request.body["max_completion_tokens"] == 50
    assert request.body["temperature"] == 0.2
    assert request.estimate.max_output == 50
    assert request.model == "acme/chat-large" and request.door.name == "responses"
    assert request.store is True and request.stream is False
    assert request.features == frozenset()


def test_it_translates_items_function_tools_and_text_format():
    request = parse(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "message", "role": "assistant", "content": "Let me look."},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city":"Oslo"}',
                },
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "get_weather",
                    "arguments": '{"city":"Rome"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "cold"},
                {"type": "function_call_output", "call_id": "c2", "output": "warm"},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}
                    ],
                },
            ],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "w",
                    "strict": True,
                    "schema": {"type": "object"},
                }
            },
            "stream": True,
        }
    )

    assert request.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
        {"role": "tool", "tool_call_id": "c2", "content": "warm"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}
            ],
        },
    ]
    assert request.body["tools"] == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]
    assert request.body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert request.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
    }
    assert request.features == {"tools", "response_format", "stream"}
    assert request.stream and request.body["stream"] is True
    assert request.estimate.structured_output == "json_schema"


def test_it_keeps_switchyards_routing_fields_and_session():
    request = parse(
        {
            "model": "m",
            "input": "hi",
            "provider": {"only": ["alpha"]},
            "models": ["n"],
            "user": "u1",
            "store": False,
        },
        headers={"x-session-id": "s-9"},
    )

    assert request.preferences.only == ("alpha",)
    assert request.models == ("n",) and request.body["models"] == ["n"]
    assert request.user == "u1" and request.session_id == "s-9"
    assert request.store is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
        ),
        (
            {"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        ({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {"model": "m", "input": "hi", "text": {"format": {"type": "json_schema"}}},
            "text.format.name",
        ),
        ({"model": "m", "input": "hi", "max_output_tokens": "5"}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "background": True}, "background"),
        ({"model": "m", "input": "hi", "provider": {"only": "alpha"}}, "provider"),
    ],
)
def test_it_names_the_field_of_a_bad_body(body, param):
    with pytest.raises(InvalidRequest) as refused:
        parse(body)

    assert refused.value.param == param, refused.value.message
    assert refused.value.status == 400


def test_it_puts_the_earlier_turn_before_this_input_without_its_instructions():
    earlier = StoredTurn(
        id="resp_aa",
        conversation=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": "Hello Ada."},
        ],
        session="resp_root",
    )
    door = ResponsesDoor(previous=earlier)

    request = parse(
        {
            "model": "m",
            "input": "What is my name?",
            "instructions": "Now terse.",
            "previous_response_id": "resp_aa",
        },
        door=door,
    )

    assert request.body["messages"] == [
        {"role": "system", "content": "Now terse."},
        *earlier.conversation,
        {"role": "user", "content": "What is my name?"},
    ]
    assert request.conversation == (*earlier.conversation, request.body["messages"][-1])
    assert request.session_id == "resp_root"  # G12: one conversation, one pin


def test_it_refuses_a_previous_response_it_does_not_have():
    with pytest.raises(NotFound) as refused:
        parse({"model": "m", "input": "x", "previous_response_id": "resp_zz"})

    assert refused.value.param == "previous_response_id"
    assert refused.value.status == 404


def test_it_passes_on_why_the_earlier_turn_could_not_be_read():
    door = ResponsesDoor(previous=ServiceUnavailable("database away"))

    with pytest.raises(ServiceUnavailable):
        parse({"model": "m", "input": "x", "previous_response_id": "resp_aa"}, door=door)


@pytest.mark.parametrize(
    ("raw", "found"),
    [
        (b'{"previous_response_id": "resp_ab12"}', "resp_ab12"),
        (b'{"input": "no previous"}', None),
        (b'{"previous_response_id": "resp_\\u0000"}', None),  # PostgreSQL cannot compare a NUL
        (b'{"previous_response_id": 5}', None),
        (b"not json previous_response_id", None),
    ],
)
def test_it_reads_the_previous_response_id_to_look_up(raw, found):
    assert previous_id_read(raw) == found


def test_it_answers_a_chat_completion_as_a_response():
    request = parse(
        {
            "model": "acme/chat-large",
            "input": "hi",
            "store": False,
            "tools": [WEATHER],
            "metadata": {"k": "v"},
        }
    )
    completion = Completion(
        body={
            "choices": [
                {
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
        usage=Usage(input_tokens=10, cached_input_tokens=4, output_tokens=5),
        finish_reason="tool_calls",
    )

    answer = asyncio.run(request.door.answer(request, completion, completion.usage, HOW))

    assert answer["id"] == "resp_0123abcd" == response_id(HOW.call_id)
    assert answer["object"] == "response" and answer["status"] == "completed"
    assert answer["model"] == "acme/chat-large" and answer["provider"] == "alpha"
    assert [item["type"] for item in answer["output"]] == ["message", "function_call"]
    assert answer["output"][0]["content"] == [
        {"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}
    ]
    call = answer["output"][1]
    assert (call["call_id"], call["name"], call["arguments"]) == (
        "call_1",
        "get_weather",
        '{"city":"Oslo"}',
    )
    assert answer["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
        "cost": 0.015,
    }
    assert answer["tools"] == [WEATHER] and answer["metadata"] == {"k": "v"}
    assert answer["store"] is False


def test_it_says_a_response_cut_at_its_limit_is_incomplete():
    request = parse({"model": "m", "input": "hi", "store": False, "max_output_tokens": 3})
    completion = Completion(
        body={"choices": [{"message": {"content": "one two"}, "finish_reason": "length"}]},
        usage=Usage(input_tokens=2, output_tokens=3),
        finish_reason="length",
    )

    answer = asyncio.run(request.door.answer(request, completion, completion.usage, HOW))

    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer["max_output_tokens"] == 3


def test_it_turns_output_back_into_the_message_a_later_turn_sends():
    message = {
        "content": "Sure.",
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
    }

    assert assistant_message(output_items(message, response="resp_1", status="completed")) == {
        "role": "assistant",
        "content": "Sure.",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }


def test_it_lets_the_router_see_one_conversation_across_stored_turns():
    """G12: with no session named, a conversation is keyed by its leading messages, which a
    turn continued by previous_response_id repeats; so both turns have one key."""
    body = {"model": "m", "input": "Plan a trip.", "instructions": "You are a travel agent."}
    first = parse(body)
    earlier = StoredTurn(
        id="resp_ab",
        conversation=[*first.conversation, {"role": "assistant", "content": "Where to?"}],
        session="",
    )
    second = parse(
        {**body, "input": "Lisbon.", "previous_response_id": "resp_ab"},
        door=ResponsesDoor(previous=earlier),
    )

    def key(request):
        return conversation_key(
            tenant="1",
            model="m",
            session_id=request.session_id,
            user=request.user,
            messages=request.body["messages"],
        )

    assert first.session_id is None and second.session_id is None
    assert key(second) == key(first) is not None
