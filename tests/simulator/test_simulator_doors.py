"""Structured outputs, forced tool calls and extended thinking from the real simulator processes,
spoken to with the official SDKs (issue 16 item 6)."""

import json
import textwrap

import anthropic
import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from simulator.launcher import running_simulator
from simulator.model import count_text_tokens

pytestmark = pytest.mark.e2e

# "paced" streams its answer over several writes, so a stream's blocks cross write boundaries.
FAST = "{ttft_ms: {median: 1, p95: 2}, tokens_per_s: {median: 20000, p05: 10000}}"
PACED = (
    "{ttft_ms: {median: 1, p95: 2}, tokens_per_s: {median: 2000, p05: 1500}, "
    "output_tokens: {median: 80, p95: 120}, tool_call_rate: 1.0}"
)
MARKET = textwrap.dedent(
    f"""
    providers:
      - name: oa
        port: 0
        protocol: openai
        limits: {{requests_per_minute: 100000, input_tokens_per_minute: 100000000, output_tokens_per_minute: 100000000}}
        models: {{fast: {FAST}}}
      - name: an
        port: 0
        protocol: anthropic
        limits: {{requests_per_minute: 100000, input_tokens_per_minute: 100000000, output_tokens_per_minute: 100000000}}
        models: {{fast: {FAST}, paced: {PACED}}}
    """
)
HELLO = [{"role": "user", "content": "Tell me about the order."}]


class Line(BaseModel):
    sku: str = Field(max_length=8)
    quantity: int = Field(ge=1, le=9)


class Order(BaseModel):
    customer: str
    email: str | None
    lines: list[Line] = Field(min_length=1)
    priority: str = Field(pattern="^(low|high)$")
    express: bool


class Lookup(BaseModel):
    city: str
    days: int = Field(ge=1, le=7)


ORDER_SCHEMA = Order.model_json_schema()
LOOKUP_SCHEMA = Lookup.model_json_schema()


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    market = tmp_path_factory.mktemp("market") / "market.yaml"
    market.write_text(MARKET)
    with running_simulator(market, latency_scale=1.0, seed=7) as ports:
        yield ports


def oa(ports) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{ports['oa']}/v1", api_key="sk-test", max_retries=0
    )


def an(ports) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=f"http://127.0.0.1:{ports['an']}", api_key="sk-ant-test", max_retries=0
    )


def anthropic_post(ports, body) -> httpx.Response:
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    return httpx.post(f"http://127.0.0.1:{ports['an']}/v1/messages", json=body, headers=headers)


# --- structured outputs ------------------------------------------------------------------


@pytest.mark.parametrize("attempt", range(5))
def test_the_openai_sdk_parses_an_answer_into_the_pydantic_model_asked_for(ports, attempt):
    completion = oa(ports).chat.completions.parse(
        model="fast", messages=HELLO, max_tokens=2000, response_format=Order
    )

    message = completion.choices[0].message
    assert isinstance(message.parsed, Order) and message.parsed.lines
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.completion_tokens == count_text_tokens(message.content)


def test_it_streams_json_that_is_valid_against_the_schema(ports):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "order", "schema": ORDER_SCHEMA, "strict": True},
    }

    stream = oa(ports).chat.completions.create(
        model="fast", messages=HELLO, max_tokens=2000, response_format=response_format, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    jsonschema.validate(json.loads(text), ORDER_SCHEMA)


def test_it_answers_json_mode_with_a_json_object(ports):
    completion = oa(ports).chat.completions.create(
        model="fast", messages=HELLO, max_tokens=2000, response_format={"type": "json_object"}
    )

    assert isinstance(json.loads(completion.choices[0].message.content), dict)


def test_structured_json_cut_off_by_max_tokens_stops_for_length(ports):
    response_format = {"type": "json_schema", "json_schema": {"name": "o", "schema": ORDER_SCHEMA}}

    completion = oa(ports).chat.completions.create(
        model="fast", messages=HELLO, max_tokens=4, response_format=response_format
    )

    choice = completion.choices[0]
    assert choice.finish_reason == "length" and completion.usage.completion_tokens == 4
    assert choice.message.content.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content)


def test_it_refuses_a_json_schema_format_without_a_name(ports):
    with pytest.raises(openai.BadRequestError) as refused:
        oa(ports).chat.completions.create(
            model="fast",
            messages=HELLO,
            response_format={"type": "json_schema", "json_schema": {"schema": ORDER_SCHEMA}},
        )

    assert refused.value.body["param"] == "response_format.json_schema.name"


def test_anthropic_structured_outputs_answer_json_valid_against_the_schema(ports):
    for field in ("output_config", "output_format"):
        spec = {"type": "json_schema", "schema": ORDER_SCHEMA}
        body = {"model": "fast", "max_tokens": 2000, "messages": HELLO}
        body[field] = {"format": spec} if field == "output_config" else spec

        answer = anthropic_post(ports, body)

        assert answer.status_code == 200, answer.text
        (block,) = answer.json()["content"]
        Order.model_validate_json(block["text"])


# --- forced tool calls -------------------------------------------------------------------


@pytest.mark.parametrize("attempt", range(5))
def test_an_openai_tool_forced_by_name_is_called_with_valid_arguments(ports, attempt):
    tools = [openai.pydantic_function_tool(Order), openai.pydantic_function_tool(Lookup)]

    completion = oa(ports).chat.completions.parse(
        model="fast",
        messages=HELLO,
        max_tokens=2000,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "Lookup"}},
    )

    (call,) = completion.choices[0].message.tool_calls
    assert completion.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "Lookup" and isinstance(call.function.parsed_arguments, Lookup)
    jsonschema.validate(json.loads(call.function.arguments), tools[1]["function"]["parameters"])


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "order"}, {"type": "any"}])
def test_an_anthropic_forced_tool_use_has_input_valid_against_its_schema(ports, choice):
    tools = [{"name": "order", "description": "Place an order", "input_schema": ORDER_SCHEMA}]
    if choice["type"] == "any":
        tools = [*tools, {"name": "order2", "input_schema": ORDER_SCHEMA}]

    for _ in range(5):
        message = an(ports).messages.create(
            model="fast", max_tokens=2000, messages=HELLO, tools=tools, tool_choice=choice
        )

        (block,) = message.content
        assert message.stop_reason == "tool_use" and block.type == "tool_use"
        assert choice["type"] == "any" or block.name == "order"
        jsonschema.validate(block.input, ORDER_SCHEMA)


# --- extended thinking -------------------------------------------------------------------

THINKING = {"type": "enabled", "budget_tokens": 1024}


def test_it_thinks_before_answering_when_asked(ports):
    message = an(ports).messages.create(
        model="paced", max_tokens=2000, messages=HELLO, thinking=THINKING
    )

    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature
    assert text.type == "text" and text.text and message.stop_reason == "end_turn"
    assert message.usage.output_tokens == (
        count_text_tokens(thinking.thinking) + count_text_tokens(text.text)
    )


def test_it_streams_thinking_deltas_and_a_signature_before_the_answer(ports):
    with an(ports).messages.stream(
        model="paced", max_tokens=2000, messages=HELLO, thinking=THINKING
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()

    deltas = [(e.index, e.delta.type) for e in events if e.type == "content_block_delta"]
    kinds = [d for _, d in deltas]
    starts = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts == [(0, "thinking"), (1, "text")] and stops == [0, 1]
    signature_at = kinds.index("signature_delta")
    assert set(kinds[:signature_at]) == {"thinking_delta"} and len(kinds[:signature_at]) > 1
    assert set(kinds[signature_at + 1 :]) == {"text_delta"}
    assert {i for i, d in deltas if d != "text_delta"} == {0}
    thinking, text = final.content
    assert thinking.signature and final.usage.output_tokens == (
        count_text_tokens(thinking.thinking) + count_text_tokens(text.text)
    )


def test_it_thinks_before_a_tool_call_in_a_stream(ports):
    tools = [{"name": "lookup", "input_schema": LOOKUP_SCHEMA}]

    with an(ports).messages.stream(
        model="paced", max_tokens=2000, messages=HELLO, thinking=THINKING, tools=tools
    ) as stream:
        final = stream.get_final_message()

    thinking, tool_use = final.content
    assert thinking.type == "thinking" and thinking.signature
    assert tool_use.type == "tool_use" and final.stop_reason == "tool_use"
    jsonschema.validate(tool_use.input, LOOKUP_SCHEMA)


def test_the_thinking_stays_within_its_budget_and_the_answer_within_max_tokens(ports):
    message = an(ports).messages.create(
        model="paced",
        max_tokens=1030,
        messages=HELLO,
        thinking={"type": "enabled", "budget_tokens": 1029},
    )

    thinking = message.content[0]
    assert count_text_tokens(thinking.thinking) <= 1029
    assert message.usage.output_tokens <= 1030


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1000}}, "greater than or equal to 1024"),
        ({"thinking": {"type": "enabled", "budget_tokens": 3000}}, "`max_tokens` must be greater"),
        ({"thinking": {"type": "sometimes"}}, "expected tags"),
        (
            {
                "thinking": THINKING,
                "tools": [{"name": "lookup", "input_schema": LOOKUP_SCHEMA}],
                "tool_choice": {"type": "any"},
            },
            "tool_choice forces tool use",
        ),
    ],
)
def test_it_refuses_thinking_it_cannot_do(ports, fields, says):
    answer = anthropic_post(
        ports, {"model": "fast", "max_tokens": 2000, "messages": HELLO, **fields}
    )

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and says in error["message"]
