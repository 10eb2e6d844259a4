"""A request one provider's protocol cannot express goes to the next candidate (C5, G14)."""

import httpx
import pytest

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"
AUDIO = [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]


def post(stack, messages, **fields):
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "acme/chat-large", "messages": messages, **fields},
        timeout=30,
    )


@pytest.mark.parametrize(
    "messages",
    [[{"role": "user", "content": AUDIO}], [{"role": "system", "content": "only a system prompt"}]],
    ids=["audio", "system only"],
)
def test_it_serves_on_the_next_endpoint_what_the_first_cannot_express(stack, messages):
    # beta speaks Anthropic's protocol: no audio parts, no request without a user turn.
    response = post(stack, messages, provider={"order": ["beta", "alpha"]})
    assert response.status_code == 200, response.text
    assert response.headers["x-switchyard-provider"] == "alpha"
    assert response.headers["x-switchyard-attempts"] == "1"  # nothing was sent to beta


def test_it_refuses_what_no_endpoint_can_express(stack):
    response = post(stack, [{"role": "user", "content": AUDIO}], provider={"only": ["beta"]})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_by_provider"
