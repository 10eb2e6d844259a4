"""Retry decisions (F1–F5): one budget, Retry-After as a floor, never past the deadline."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotas.core.retry import BACKOFF_CAP, Failure, Next, backoff_delay, retry_decide


def decide(failure, **overrides):
    options = dict(
        retries_used=0,
        retry_budget=2,
        retry_after=None,
        now=0.0,
        deadline=30.0,
        expected_attempt_seconds=1.0,
        fallback_allowed=False,
        endpoints_left=0,
        rng=random.Random(1),
    )
    options.update(overrides)
    return retry_decide(failure, **options)


@pytest.mark.parametrize("failure", [Failure.POLICY, Failure.REQUEST_ERROR])
def test_it_never_retries_policy_or_request_errors_on_the_same_endpoint(failure):
    assert decide(failure).next is Next.GIVE_UP
    assert decide(failure).reason == "not_retryable"


def test_it_moves_a_policy_refusal_to_another_endpoint_when_fallback_is_allowed():
    assert (
        decide(Failure.POLICY, fallback_allowed=True, endpoints_left=1).next is Next.NEXT_ENDPOINT
    )
    assert (
        decide(Failure.REQUEST_ERROR, fallback_allowed=True, endpoints_left=1).next is Next.GIVE_UP
    )


@pytest.mark.parametrize("failure", [Failure.CAPACITY, Failure.OVERLOAD, Failure.PROVIDER_ERROR])
def test_it_spends_one_budget_on_retries_and_fallbacks_alike(failure):
    assert decide(failure, retries_used=2).reason == "budget_exhausted"
    assert (
        decide(failure, retries_used=2, fallback_allowed=True, endpoints_left=3).reason
        == "budget_exhausted"
    )
    assert (
        decide(failure, retries_used=1, fallback_allowed=True, endpoints_left=3).next
        is Next.NEXT_ENDPOINT
    )


def test_it_treats_retry_after_as_a_floor():
    decision = decide(Failure.CAPACITY, retry_after=5.0)
    assert decision.next is Next.SAME_ENDPOINT
    assert decision.delay >= 5.0


def test_it_gives_up_when_the_retry_cannot_finish_before_the_deadline():
    assert decide(Failure.CAPACITY, retry_after=5.0, deadline=5.5).reason == "deadline"
    assert decide(Failure.CAPACITY, retry_after=5.0, deadline=6.5).next is Next.SAME_ENDPOINT


@given(st.integers(0, 30), st.integers(0, 2**32))
def test_it_jitters_backoff_within_the_exponential_envelope(retry_number, seed):
    delay = backoff_delay(retry_number, random.Random(seed))
    assert 0.0 <= delay <= min(BACKOFF_CAP, 0.25 * 2**retry_number)


def test_it_gives_up_instead_of_retrying_an_endpoint_behind_an_open_breaker():
    assert decide(Failure.OVERLOAD, breaker_open=True).reason == "breaker_open"
    # Another endpoint is still tried; the budget and the deadline speak first.
    moved = decide(Failure.OVERLOAD, breaker_open=True, fallback_allowed=True, endpoints_left=1)
    assert moved.next is Next.NEXT_ENDPOINT
    spent = decide(Failure.OVERLOAD, breaker_open=True, retries_used=2)
    assert spent.reason == "budget_exhausted"
