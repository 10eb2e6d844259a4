"""An Idempotency-Key stands for a request that reached a provider, not for a refused one (E3)."""

import uuid

import httpx
import pytest

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"


def post(stack, idempotency_key, **fields):
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}", "Idempotency-Key": idempotency_key},
        json={
            "model": "acme/chat-small",
            "messages": [{"role": "user", "content": "hi"}],
            **fields,
        },
        timeout=30,
    )


@pytest.mark.parametrize(
    "refused",
    [
        {"max_tokens": 1_000_000},  # no endpoint can serve it
        {"provider": {"sort": "fastest"}},  # a bad routing override
    ],
    ids=["no endpoint", "bad override"],
)
def test_it_accepts_a_corrected_retry_under_the_key_of_a_refused_request(stack, refused):
    idempotency_key = f"order-{uuid.uuid4().hex}"
    first = post(stack, idempotency_key, **refused)
    assert first.status_code == 400
    corrected = post(stack, idempotency_key)
    assert corrected.status_code == 200, corrected.text
    repeated = post(stack, idempotency_key)
    assert repeated.status_code == 409
    assert corrected.json()["id"] in repeated.json()["error"]["message"]


def test_it_keeps_the_claim_of_another_request_when_refusing_a_repeat(stack):
    idempotency_key = f"order-{uuid.uuid4().hex}"
    assert post(stack, idempotency_key).status_code == 200
    assert post(stack, idempotency_key).status_code == 409
    assert post(stack, idempotency_key).status_code == 409
