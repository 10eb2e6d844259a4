"""Extended thinking and forced tool use through the gateway's Messages door to the simulator,
with the official anthropic SDK (issue 16 item 6)."""

import jsonschema
import pytest
from anthropic import Anthropic

from simulator.model import count_text_tokens
from tests.stack import wait_until

pytestmark = pytest.mark.e2e
# Until the messages branch is merged, this branch has no /v1/messages to test through.
pytest.importorskip("gateway.doors.messages", reason="the Messages door is not merged yet")

KEY = "sk-sy-test-acme-web-0001"
MODEL = "acme/chat-large"  # beta speaks Anthropic's protocol: the request passes through
ASK = [{"role": "user", "content": "Think first, then answer."}]
THINKING = {"type": "enabled", "budget_tokens": 1024}
ONLY_BETA = {"provider": {"only": ["beta"]}}
LOOKUP = {
    "name": "lookup",
    "description": "Look a customer up",
    "input_schema": {
        "type": "object",
        "properties": {
            "customer": {"type": "string", "minLength": 3},
            "since": {"type": "string", "format": "date"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        "required": ["customer", "limit"],
        "additionalProperties": False,
    },
}


@pytest.fixture
def client(stack):
    return Anthropic(base_url=stack.base_url, api_key=KEY, max_retries=0)


def test_a_thinking_block_comes_back_before_the_answer_and_is_billed_as_output(client, stack):
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=2000, messages=ASK, thinking=THINKING, extra_body=ONLY_BETA
    )
    message = raw.parse()

    thinking, text = message.content
    assert raw.headers["x-switchyard-provider"] == "beta"
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature
    assert text.type == "text" and text.text
    output = count_text_tokens(thinking.thinking) + count_text_tokens(text.text)
    assert message.usage.output_tokens == output

    def recorded():
        return stack.sql(
            "select output_tokens from gateway_generation where id = %s",
            raw.headers["x-request-id"],
        )

    wait_until(lambda: bool(recorded()), timeout=15, what="the ledger row")
    assert recorded() == [(output,)], "the ledger counts the thinking as output"


def test_thinking_streams_as_deltas_then_a_signature_then_the_answer(client):
    with client.messages.stream(
        model=MODEL, max_tokens=2000, messages=ASK, thinking=THINKING, extra_body=ONLY_BETA
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()

    signature_at = deltas.index("signature_delta")
    assert set(deltas[:signature_at]) == {"thinking_delta"}
    assert set(deltas[signature_at + 1 :]) == {"text_delta"}
    thinking, text = final.content
    assert thinking.signature and text.text
    assert final.usage.output_tokens == (
        count_text_tokens(thinking.thinking) + count_text_tokens(text.text)
    )


@pytest.mark.parametrize("provider", ["beta", "alpha"])
def test_a_tool_forced_by_name_is_used_with_input_valid_against_its_schema(client, provider):
    for _ in range(3):
        raw = client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=2000,
            messages=ASK,
            tools=[LOOKUP],
            tool_choice={"type": "tool", "name": "lookup"},
            extra_body={"provider": {"only": [provider]}},
        )
        message = raw.parse()

        (block,) = message.content
        assert raw.headers["x-switchyard-provider"] == provider
        assert message.stop_reason == "tool_use" and block.name == "lookup"
        jsonschema.validate(block.input, LOOKUP["input_schema"])
