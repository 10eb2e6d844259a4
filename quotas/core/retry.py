"""Retries in one place (SPEC F1–F5): after a failed attempt, what happens next.

One retry budget per logical request, fallbacks included (F4, G14): moving to the next endpoint
spends from the same budget, it never starts a fresh cycle. ``Retry-After`` is a floor (F2);
without one, exponential backoff with full jitter (F3). No attempt starts that cannot finish
before the deadline (F1 "deadline").
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

BACKOFF_BASE = 0.25  # seconds before the first retry, before jitter
BACKOFF_CAP = 8.0


class Failure(enum.Enum):
    """F1's classes of a failed attempt."""

    CAPACITY = "capacity"  # temporary 429
    OVERLOAD = "overload"  # 503 / 529
    PROVIDER_ERROR = "provider_error"  # 5xx, broken answer, connection failure, timeout
    POLICY = "policy"  # spend cap, exhausted daily quota, disabled project: never retried
    REQUEST_ERROR = "request_error"  # the request itself is wrong: never retried


class Next(enum.Enum):
    SAME_ENDPOINT = "same_endpoint"
    NEXT_ENDPOINT = "next_endpoint"
    GIVE_UP = "give_up"


@dataclass(frozen=True, slots=True)
class RetryDecision:
    next: Next
    delay: float = 0.0  # seconds to wait before the next attempt
    reason: str = ""  # why we give up: budget_exhausted, deadline, not_retryable, no_endpoint


def backoff_delay(retry_number: int, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(cap, base·2^n)] (AWS Architecture Blog)."""
    return rng.uniform(0.0, min(BACKOFF_CAP, BACKOFF_BASE * 2.0**retry_number))


def retry_decide(
    failure: Failure,
    *,
    retries_used: int,
    retry_budget: int,
    retry_after: float | None,
    now: float,
    deadline: float,
    expected_attempt_seconds: float,
    fallback_allowed: bool,
    endpoints_left: int,
    rng: random.Random,
    breaker_open: bool = False,
) -> RetryDecision:
    """Decide the next step after a failed attempt; ``endpoints_left`` excludes the failed one.

    ``breaker_open``: the failed endpoint was planned behind an open breaker (G7), as the only
    way left; it failed as expected, and trying it again only loads a provider in trouble.
    """
    if failure in (Failure.POLICY, Failure.REQUEST_ERROR):
        # A policy refusal is the endpoint's, not the request's: another provider may serve it.
        if failure is Failure.POLICY and fallback_allowed and endpoints_left > 0:
            if retries_used >= retry_budget:
                return RetryDecision(Next.GIVE_UP, reason="budget_exhausted")
            return RetryDecision(Next.NEXT_ENDPOINT)
        return RetryDecision(Next.GIVE_UP, reason="not_retryable")
    if retries_used >= retry_budget:
        return RetryDecision(Next.GIVE_UP, reason="budget_exhausted")
    if fallback_allowed and endpoints_left > 0:
        # Another endpoint need not wait for this one's Retry-After or backoff.
        return RetryDecision(Next.NEXT_ENDPOINT)
    delay = backoff_delay(retries_used, rng)
    if retry_after is not None:
        delay = max(delay, retry_after)
    if now + delay + expected_attempt_seconds > deadline:
        return RetryDecision(Next.GIVE_UP, reason="deadline")
    if breaker_open:
        return RetryDecision(Next.GIVE_UP, reason="breaker_open")
    return RetryDecision(Next.SAME_ENDPOINT, delay=delay)
