"""Structured outputs and forced tool calls through the gateway to the simulator, with the
official openai SDK (issue 16 item 6): what a client's Pydantic model asks for comes back."""

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.e2e

ACME_WEB_KEY = "sk-sy-test-acme-web-0001"
MODEL = "acme/chat-large"  # alpha speaks OpenAI's protocol, beta Anthropic's (both take tools)
ASK = [{"role": "user", "content": "Which invoice lines are overdue?"}]


class InvoiceLine(BaseModel):
    sku: str = Field(max_length=12)
    quantity: int = Field(ge=1, le=99)
    overdue_days: int | None


class Overdue(BaseModel):
    customer: str
    lines: list[InvoiceLine] = Field(min_length=1)
    escalate: bool


class Remind(BaseModel):
    """Send a payment reminder."""

    customer: str
    channel: str = Field(pattern="^(email|letter)$")
    days: int = Field(ge=1, le=30)


@pytest.fixture
def client(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=ACME_WEB_KEY, max_retries=0)


@pytest.mark.parametrize("attempt", range(3))
def test_chat_completions_parse_returns_an_instance_of_the_pydantic_model(client, attempt):
    raw = client.chat.completions.with_raw_response.parse(
        model=MODEL, messages=ASK, max_tokens=2000, response_format=Overdue
    )
    completion = raw.parse()

    message = completion.choices[0].message
    assert isinstance(message.parsed, Overdue) and message.parsed.lines
    assert completion.choices[0].finish_reason == "stop"
    assert raw.headers["x-switchyard-provider"] == "alpha", "the endpoint that honours it"


@pytest.mark.parametrize("provider", ["alpha", "beta"])
def test_a_forced_tool_call_comes_back_with_arguments_valid_against_its_schema(client, provider):
    tools = [openai.pydantic_function_tool(Overdue), openai.pydantic_function_tool(Remind)]

    for _ in range(3):
        raw = client.chat.completions.with_raw_response.parse(
            model=MODEL,
            messages=ASK,
            max_tokens=2000,
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "Remind"}},
            extra_body={"provider": {"only": [provider]}},
        )
        completion = raw.parse()

        (call,) = completion.choices[0].message.tool_calls
        assert raw.headers["x-switchyard-provider"] == provider
        assert completion.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "Remind"
        assert isinstance(call.function.parsed_arguments, Remind)
        schema = tools[1]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
