"""The behaviour model's structured answers, forced tool calls and thinking (issue 16 item 6)."""

import json
import random

import jsonschema
import pytest

from simulator.model import LengthSpec, LimitsSpec, ToolSpec, count_text_tokens
from simulator.server.common import make_content
from tests.simulator.helpers import behaviour, model, provider, request

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["title", "tags", "score"],
    "additionalProperties": False,
}
LOOKUP = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
}


def tool(name, parameters=LOOKUP):
    return ToolSpec(name=name, parameters=parameters)


@pytest.mark.parametrize("seed", range(10))
def test_a_structured_answer_is_json_valid_against_the_schema_and_counted(seed):
    plan = behaviour(seed=seed).admit(0.0, request(max_tokens=1000, response_schema=SCHEMA))

    jsonschema.validate(json.loads(plan.answer_json), SCHEMA)
    assert plan.stop_reason == "end"
    assert plan.output_tokens == count_text_tokens(plan.answer_json)


def test_a_structured_answer_is_the_same_for_the_same_seed():
    answers = [
        behaviour(seed=seed).admit(0.0, request(response_schema=SCHEMA)).answer_json
        for seed in (3, 3, 4)
    ]

    assert answers[0] == answers[1] != answers[2]


def test_a_structured_answer_longer_than_max_tokens_is_cut_off():
    plan = behaviour().admit(0.0, request(max_tokens=3, response_schema=SCHEMA))

    assert plan.stop_reason == "max_tokens" and plan.output_tokens == 3
    content = make_content(plan, random.Random(1), "call_")
    assert len(content.pieces) == 3 and content.text == plan.answer_json


def test_the_wire_sends_the_structured_answer_token_by_token():
    plan = behaviour().admit(0.0, request(response_schema=SCHEMA))

    content = make_content(plan, random.Random(1), "call_")

    assert len(content.pieces) == plan.output_tokens and content.text == plan.answer_json


@pytest.mark.parametrize("seed", range(10))
def test_a_tool_forced_by_name_is_called_even_when_the_model_rarely_calls_tools(seed):
    rarely = provider(models=[model(tool_call_rate=0.0)])
    tools = (tool("search"), tool("lookup"))

    plan = behaviour(rarely, seed=seed).admit(
        0.0, request(tools=tools, tool_choice="lookup", follows_tool_result=True)
    )

    assert plan.tool_call.name == "lookup" and plan.stop_reason == "tool_use"
    jsonschema.validate(json.loads(plan.tool_call.arguments_json), LOOKUP)


def test_a_tool_call_wins_over_a_response_format():
    plan = behaviour().admit(
        0.0, request(tools=(tool("lookup"),), tool_choice="required", response_schema=SCHEMA)
    )

    assert plan.tool_call is not None and plan.answer_json is None


@pytest.mark.parametrize("seed", range(10))
def test_thinking_comes_first_within_its_budget_and_counts_as_output(seed):
    plan = behaviour(seed=seed).admit(0.0, request(max_tokens=2000, thinking_budget=1024))

    assert 1 <= plan.thinking_tokens <= 1024
    content = make_content(plan, random.Random(seed), "toolu_01")
    assert content.thinking == plan.thinking_tokens and content.signature
    assert count_text_tokens(content.thinking_text) == plan.thinking_tokens
    assert count_text_tokens(content.text) == plan.output_tokens - plan.thinking_tokens >= 1


def test_thinking_leaves_room_for_an_answer_under_a_tight_cap():
    long_thinker = provider(models=[model(output_tokens=LengthSpec(5000, 9000))])

    plan = behaviour(long_thinker).admit(0.0, request(max_tokens=1100, thinking_budget=1024))

    assert plan.thinking_tokens == 1024
    assert plan.output_tokens <= 1100 and plan.output_tokens - plan.thinking_tokens >= 1


def test_the_output_bucket_is_refunded_what_thinking_and_answer_did_not_use():
    b = behaviour(provider(limits=LimitsSpec(output_tokens_per_minute=10_000)))
    plan = b.admit(0.0, request(max_tokens=4000, thinking_budget=2000))

    b.finish(0.0, plan, plan.tokens_to_send)

    output = b.limit_status(0.0).get("output_tokens")
    assert output.limit - output.remaining == plan.output_tokens


def test_no_thinking_unless_asked():
    plan = behaviour().admit(0.0, request(max_tokens=2000))

    assert plan.thinking_tokens == 0
    assert make_content(plan, random.Random(1), "toolu_01").signature == ""
