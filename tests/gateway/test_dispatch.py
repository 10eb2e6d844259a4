"""One upstream attempt against a provider on a loopback port (SPEC C5, F1, H1)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable, Iterator

import httpx
import pytest

from gateway import upstream
from gateway.dispatch import Attempt, attempt_send
from gateway.doors.chat import CHAT
from gateway.errors import InvalidRequest, UpstreamQuotaExhausted, UpstreamRateLimited
from gateway.pipeline import FAILURES
from gateway.providers.base import Outcome
from quotas.core.retry import Next, retry_decide
from routing.catalogue import EndpointEntry, ProviderEntry
from tests.loopback_provider import LoopbackProvider

BASE_URL = "http://provider.test/v1"
SECRET_PARTS = ("sk-proj-abcd", "wxyz", "org-PLATFORM", "proj_PLATFORM", "Used 29500")
ENDPOINT = EndpointEntry(
    id=1,
    key="acme/chat@openai",
    model_id=1,
    model_slug="acme/chat",
    provider=ProviderEntry(
        id=1,
        name="openai",
        protocol="openai",
        base_url=BASE_URL,
        api_key="sk-proj-abcd0123456789wxyz",
        cache_ttl_seconds=300,
    ),
    upstream_model="gpt-4o",
    price_input=1.0,
    price_cached_input=0.1,
    price_output=2.0,
    context_window=128000,
    max_output=4096,
    supports=frozenset({"tools", "stream"}),
)
# What OpenAI really answers: the platform's key (masked), organisation, project and the shared
# pool's usage — none of it is the caller's business.
PROVIDER_ERRORS = {
    "bad credential": (
        401,
        "Incorrect API key provided: sk-proj-abcd****wxyz. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "invalid_api_key",
        {},
    ),
    "rate limited": (
        429,
        "Rate limit reached for gpt-4o in organization org-PLATFORM on tokens per min (TPM): "
        "Limit 30000, Used 29500, Requested 900. Please try again in 1.8s.",
        "rate_limit_exceeded",
        {"retry-after": "2"},
    ),
    "quota exhausted": (
        429,
        "You exceeded your current quota (org-PLATFORM), please check your plan and billing.",
        "insufficient_quota",
        {},
    ),
    "no access": (
        403,
        "Project `proj_PLATFORM` does not have access to model `gpt-4o`",
        "model_not_found",
        {},
    ),
    "server error": (500, "The server had an error (org-PLATFORM).", "server_error", {}),
}


@pytest.fixture
def provider() -> Iterator[LoopbackProvider]:
    """The provider, on a loopback port: set ``provider.answer`` before ``send``."""
    with LoopbackProvider(lambda body: httpx.Response(500)) as served:
        yield served


def send(provider: LoopbackProvider) -> Attempt:
    body = b'{"model": "acme/chat", "messages": [{"role": "user", "content": "hi"}]}'
    request = CHAT.parse(body, {})
    base_url = provider.url + "/v1"
    endpoint = dataclasses.replace(
        ENDPOINT, provider=dataclasses.replace(ENDPOINT.provider, base_url=base_url)
    )

    async def once() -> Attempt:
        try:
            return await attempt_send(
                endpoint, request, response_id="gen-1", model="acme/chat", created=1
            )
        finally:
            await upstream.clients_close()

    return asyncio.run(once())


def answered(response: httpx.Response) -> Callable[[bytes], httpx.Response]:
    return lambda body: response


def answer(status: int, message: str, code: str, headers: dict[str, str]) -> httpx.Response:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return httpx.Response(status, headers=headers, content=json.dumps({"error": error}))


@pytest.mark.parametrize("case", PROVIDER_ERRORS, ids=list(PROVIDER_ERRORS))
def test_it_never_tells_the_caller_the_providers_credential_account_or_usage(provider, case):
    provider.answer = answered(answer(*PROVIDER_ERRORS[case]))
    attempt = send(provider)
    assert attempt.error is not None
    told = json.dumps(attempt.error.envelope())
    assert not [part for part in SECRET_PARTS if part in told], told
    assert "openai" in attempt.error.message  # still says who failed, and how
    assert attempt.failure is not None
    assert attempt.failure.message == PROVIDER_ERRORS[case][1]  # kept for logs


def test_it_passes_on_why_the_provider_rejected_the_callers_request(provider):
    provider.answer = answered(answer(400, "'messages' must contain the word 'json'.", "bad", {}))
    attempt = send(provider)
    assert isinstance(attempt.error, InvalidRequest)
    assert "must contain the word 'json'" in attempt.error.message


def test_it_says_when_to_retry_after_the_provider_refused_for_capacity(provider):
    provider.answer = answered(answer(*PROVIDER_ERRORS["rate limited"]))
    attempt = send(provider)
    assert isinstance(attempt.error, UpstreamRateLimited)
    assert attempt.error.retry_after == 2.0
    provider.answer = answered(answer(429, "Slow down.", "rate_limit_exceeded", {}))
    assert send(provider).error.retry_after == 1.0  # type: ignore[union-attr]


def test_it_tells_the_caller_an_exhausted_provider_account_is_not_their_rate(provider):
    provider.answer = answered(answer(*PROVIDER_ERRORS["quota exhausted"]))
    attempt = send(provider)
    assert isinstance(attempt.error, UpstreamQuotaExhausted)
    envelope = attempt.error.envelope()["error"]
    assert attempt.error.status == 503 and envelope["code"] == "upstream_quota_exhausted"


def test_it_moves_on_from_a_provider_that_refuses_our_credential_and_never_retries_it():
    def decide(endpoints_left: int):
        return retry_decide(
            FAILURES[Outcome.AUTH],
            retries_used=0,
            retry_budget=2,
            retry_after=None,
            now=0.0,
            deadline=10.0,
            expected_attempt_seconds=0.1,
            fallback_allowed=True,
            endpoints_left=endpoints_left,
            rng=random.Random(0),
        )

    assert decide(endpoints_left=1).next is Next.NEXT_ENDPOINT
    alone = decide(endpoints_left=0)
    assert (alone.next, alone.reason) == (Next.GIVE_UP, "not_retryable")
