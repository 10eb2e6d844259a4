"""An Idempotency-Key stands for a delivered answer (E3): a repeat gets it again; a request
that delivered nothing gives its key back; another body under the same key is refused."""

import uuid

import httpx
import pytest

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"
INDEXER_KEY = "sk-sy-test-acme-indexer-0001"


def post(stack, idempotency_key, key=KEY, **fields):
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idempotency_key},
        json={
            "model": "acme/chat-small",
            "messages": [{"role": "user", "content": "hi"}],
            **fields,
        },
        timeout=30,
    )


def new_key():
    return f"order-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    "refused",
    [
        {"max_tokens": 1_000_000},  # no endpoint can serve it
        {"provider": {"sort": "fastest"}},  # a bad routing override
    ],
    ids=["no endpoint", "bad override"],
)
def test_it_accepts_a_corrected_retry_under_the_key_of_a_refused_request(stack, refused):
    idempotency_key = new_key()
    first = post(stack, idempotency_key, **refused)
    assert first.status_code == 400
    corrected = post(stack, idempotency_key)
    assert corrected.status_code == 200, corrected.text
    assert "idempotent-replayed" not in corrected.headers


def test_it_replays_the_answer_of_a_repeat_without_sending_it_again(stack):
    idempotency_key = new_key()
    first = post(stack, idempotency_key)
    assert first.status_code == 200, first.text
    for _ in range(2):
        repeat = post(stack, idempotency_key)
        assert repeat.status_code == 200
        assert repeat.headers["idempotent-replayed"] == "true"
        assert repeat.json() == first.json()
        assert repeat.headers["x-request-id"] == first.headers["x-request-id"]


def test_it_refuses_the_same_key_with_another_body(stack):
    idempotency_key = new_key()
    assert post(stack, idempotency_key).status_code == 200
    other = post(stack, idempotency_key, max_tokens=5)
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"


def test_it_gives_the_key_back_when_no_provider_could_answer(stack):
    idempotency_key = new_key()
    first = post(stack, idempotency_key, model="e2e/unreachable")
    assert first.status_code == 502
    retry = post(stack, idempotency_key, model="e2e/unreachable")
    assert retry.status_code == 502, "the retry was served again, not refused with 409"


def test_it_names_the_generation_of_a_streamed_answer_instead_of_replaying_it(stack):
    idempotency_key = new_key()
    first = post(stack, idempotency_key, stream=True)
    assert first.status_code == 200
    repeat = post(stack, idempotency_key, stream=True)
    assert repeat.status_code == 409
    assert first.headers["x-request-id"] in repeat.json()["error"]["message"]


def test_it_keeps_the_keys_of_two_apps_of_one_tenant_apart(stack):
    idempotency_key = new_key()
    assert post(stack, idempotency_key, key=KEY).status_code == 200
    other_app = post(stack, idempotency_key, key=INDEXER_KEY)
    assert other_app.status_code == 200
    assert "idempotent-replayed" not in other_app.headers


def test_it_refuses_a_key_longer_than_255_characters(stack):
    refused = post(stack, "k" * 256)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "Idempotency-Key"
