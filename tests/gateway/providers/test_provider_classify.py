"""SPEC F1 classification of provider answers, including the 429s that must not be retried."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.providers.anthropic import AnthropicAdapter
from gateway.providers.base import Outcome
from gateway.providers.errors import MESSAGE_LIMIT
from gateway.providers.openai import OpenAIAdapter

OPENAI = OpenAIAdapter()
ANTHROPIC = AnthropicAdapter()


def openai_error(message: str, type_: str | None = None, code: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    ).encode()


def anthropic_error(type_: str, message: str, error_code: str | None = None) -> bytes:
    error: dict[str, Any] = {"type": type_, "message": message}
    if error_code:
        error["details"] = {"error_code": error_code}
    return json.dumps({"type": "error", "error": error, "request_id": "req_011"}).encode()


RATE_LIMITED = (
    "Rate limit reached for chat-large in organization org-x on tokens per min (TPM): Limit "
    "30000, Used 29000, Requested 2000. Visit https://platform.openai.com/account/rate-limits. "
    "You can increase your rate limit by adding a payment method at "
    "https://platform.openai.com/account/billing."
)


@pytest.mark.parametrize(
    ("status", "body", "outcome", "code"),
    [
        (200, b"{}", Outcome.OK, ""),
        (
            429,
            openai_error(RATE_LIMITED, "tokens", "rate_limit_exceeded"),
            Outcome.CAPACITY,
            "rate_limit_exceeded",
        ),
        (429, openai_error("Slow down", None, "slow_down"), Outcome.CAPACITY, "slow_down"),
        (
            429,
            openai_error(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            ),
            Outcome.POLICY,
            "insufficient_quota",
        ),
        (
            429,
            openai_error("no money", "insufficient_quota", "credit_balance_exhausted"),
            Outcome.POLICY,
            "credit_balance_exhausted",
        ),
        (
            429,
            openai_error("cap", "insufficient_quota", "project_spend_limit_exceeded"),
            Outcome.POLICY,
            "project_spend_limit_exceeded",
        ),
        (429, openai_error("You exceeded your current quota"), Outcome.POLICY, ""),
        (402, openai_error("Insufficient credits"), Outcome.POLICY, ""),
        (
            503,
            openai_error("The engine is currently overloaded", "server_error"),
            Outcome.OVERLOAD,
            "server_error",
        ),
        (502, b"<html>Bad Gateway</html>", Outcome.PROVIDER_ERROR, ""),
        (504, b"", Outcome.PROVIDER_ERROR, ""),
        (
            500,
            openai_error("The server had an error", "server_error"),
            Outcome.PROVIDER_ERROR,
            "server_error",
        ),
        (
            400,
            openai_error(
                "context_length_exceeded", "invalid_request_error", "context_length_exceeded"
            ),
            Outcome.REQUEST_ERROR,
            "context_length_exceeded",
        ),
        (
            404,
            openai_error("The model does not exist", "invalid_request_error", "model_not_found"),
            Outcome.REQUEST_ERROR,
            "model_not_found",
        ),
        (413, b"Request Entity Too Large", Outcome.REQUEST_ERROR, ""),
        (422, b'{"detail": "bad field"}', Outcome.REQUEST_ERROR, ""),
        (
            401,
            openai_error("Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
            Outcome.AUTH,
            "invalid_api_key",
        ),
        (
            403,
            openai_error("Country not supported", None, "unsupported_country_region_territory"),
            Outcome.POLICY,
            "unsupported_country_region_territory",
        ),
        (408, b"timeout", Outcome.PROVIDER_ERROR, ""),
        (418, b"teapot", Outcome.REQUEST_ERROR, ""),
    ],
)
def test_it_classifies_openai_answers(
    status: int, body: bytes, outcome: Outcome, code: str
) -> None:
    classified = OPENAI.classify(status, {}, body)
    assert classified.outcome is outcome
    assert classified.provider_code == code
    assert classified.message


@pytest.mark.parametrize(
    ("status", "headers", "body", "outcome"),
    [
        (
            429,
            {"retry-after": "12"},
            anthropic_error(
                "rate_limit_error", "This request would exceed the rate limit for your organization"
            ),
            Outcome.CAPACITY,
        ),
        # The spend cap: documented as 429 rate_limit_error + details code and no retry-after.
        (
            429,
            {},
            anthropic_error("rate_limit_error", "spend", "enforced_spend_limit_reached"),
            Outcome.POLICY,
        ),
        (
            429,
            {"retry-after": "60"},
            anthropic_error("rate_limit_error", "x", "enforced_spend_limit_reached"),
            Outcome.POLICY,
        ),
        (
            429,
            {},
            anthropic_error("rate_limit_error", "x", "contract_spend_limit_reached"),
            Outcome.POLICY,
        ),
        # A 429 without retry-after that *says* it is a spend/usage limit, without a code.
        (
            429,
            {},
            anthropic_error(
                "rate_limit_error",
                "You have reached your specified API usage limits. You will regain access on 2026-01-01",
            ),
            Outcome.POLICY,
        ),
        # ... but the same words with a retry-after are a temporary limit.
        (
            429,
            {"retry-after": "30"},
            anthropic_error(
                "rate_limit_error", "You have reached your specified API usage limits."
            ),
            Outcome.CAPACITY,
        ),
        # A plain 429 without retry-after: still capacity; the broker backs off within its budget (F3).
        (
            429,
            {},
            anthropic_error(
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
            Outcome.CAPACITY,
        ),
        (
            429,
            {"retry-after": "5"},
            anthropic_error("rate_limit_error", "ramp", "ramp_limit_exceeded"),
            Outcome.CAPACITY,
        ),
        (529, {}, anthropic_error("overloaded_error", "Overloaded"), Outcome.OVERLOAD),
        (503, {}, b"upstream connect error", Outcome.OVERLOAD),
        (500, {}, anthropic_error("overloaded_error", "Overloaded"), Outcome.OVERLOAD),
        (500, {}, anthropic_error("api_error", "Internal server error"), Outcome.PROVIDER_ERROR),
        (504, {}, anthropic_error("timeout_error", "Request timed out"), Outcome.PROVIDER_ERROR),
        (
            400,
            {},
            anthropic_error("invalid_request_error", "messages: roles must alternate"),
            Outcome.REQUEST_ERROR,
        ),
        (
            400,
            {},
            anthropic_error(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API.",
            ),
            Outcome.POLICY,
        ),
        (402, {}, anthropic_error("billing_error", "Payment required"), Outcome.POLICY),
        (
            404,
            {},
            anthropic_error("not_found_error", "model: chat-large-fast"),
            Outcome.REQUEST_ERROR,
        ),
        (413, {}, b"<html><body>413 Request Entity Too Large</body></html>", Outcome.REQUEST_ERROR),
        (401, {}, anthropic_error("authentication_error", "invalid x-api-key"), Outcome.AUTH),
        (
            403,
            {},
            anthropic_error("permission_error", "Your API key does not have permission"),
            Outcome.POLICY,
        ),
        (200, {}, b"{}", Outcome.OK),
    ],
)
def test_it_classifies_anthropic_answers(
    status: int, headers: dict[str, str], body: bytes, outcome: Outcome
) -> None:
    assert ANTHROPIC.classify(status, headers, body).outcome is outcome


def test_it_uses_the_details_code_as_provider_code() -> None:
    classified = ANTHROPIC.classify(
        429, {}, anthropic_error("rate_limit_error", "cap", "enforced_spend_limit_reached")
    )
    assert classified.provider_code == "enforced_spend_limit_reached"
    assert classified.message == "cap"
    assert not classified.outcome.retryable


@pytest.mark.parametrize(
    "body", [b"", b"\xff\xfe garbage", b"[1,2]", b"null", b'{"error": 42}', b"x" * 10_000]
)
@pytest.mark.parametrize("adapter", [OPENAI, ANTHROPIC])
def test_it_never_raises_on_odd_bodies_and_truncates(adapter: Any, body: bytes) -> None:
    classified = adapter.classify(500, {"Retry-After": "garbage"}, body)
    assert classified.outcome is Outcome.PROVIDER_ERROR
    assert 0 < len(classified.message) <= MESSAGE_LIMIT


def test_it_only_retries_what_is_retryable() -> None:
    assert {o for o in Outcome if o.retryable} == {
        Outcome.CAPACITY,
        Outcome.OVERLOAD,
        Outcome.PROVIDER_ERROR,
    }
