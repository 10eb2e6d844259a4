"""Provider limits: token buckets refill continuously, 429s carry the exact time to fit."""

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.model import LimitsSpec, Plan, ProviderLimits, Rejection

from .helpers import behaviour, model, provider, request


def test_it_refuses_the_request_over_the_per_minute_limit_until_the_bucket_refills():
    b = behaviour(provider(limits=LimitsSpec(requests_per_minute=3)))
    for _ in range(3):
        assert isinstance(b.admit(0.0, request(max_tokens=10)), Plan)

    refused = b.admit(0.0, request(max_tokens=10))
    almost = b.admit(19.9, request(max_tokens=10))
    admitted = b.admit(20.0, request(max_tokens=10))

    assert isinstance(refused, Rejection)
    assert (refused.status, refused.reason, refused.retryable) == (429, "requests_per_minute", True)
    assert refused.retry_after_s == 20.0  # one request refills every 60 / 3 s
    assert refused.retry_after_header == 20
    assert isinstance(almost, Rejection)
    assert almost.retry_after_header == 1  # 0.1 s rounds up, never to 0
    assert isinstance(admitted, Plan)


def test_it_debits_max_tokens_and_refunds_what_was_not_produced():
    b = behaviour(provider(limits=LimitsSpec(output_tokens_per_minute=1000)))
    first = b.admit(0.0, request(max_tokens=600))
    assert isinstance(first, Plan)

    refused = b.admit(0.0, request(max_tokens=600))
    b.finish(0.0, first, output_tokens_sent=100)
    admitted = b.admit(0.0, request(max_tokens=600))

    assert isinstance(refused, Rejection)
    assert refused.reason == "output_tokens_per_minute"
    assert refused.retry_after_s == (600 - 400) / (1000 / 60)
    assert isinstance(admitted, Plan)
    assert b.limit_status(0.0).get("output_tokens").remaining == 1000 - 100 - 600


def test_it_debits_the_model_default_when_max_tokens_is_absent():
    spec = provider(
        limits=LimitsSpec(output_tokens_per_minute=10000), models=[model(max_output_tokens=3000)]
    )
    b = behaviour(spec)

    plan = b.admit(0.0, request())

    assert isinstance(plan, Plan) and plan.reserved_output_tokens == 3000
    assert b.limit_status(0.0).get("output_tokens").remaining == 7000


def test_it_refuses_for_good_a_request_larger_than_a_bucket():
    b = behaviour(provider(limits=LimitsSpec(input_tokens_per_minute=1000)))

    refused = b.admit(0.0, request(input_tokens=1001, max_tokens=1))

    assert isinstance(refused, Rejection)
    assert (refused.reason, refused.retryable, refused.retry_after_s) == (
        "request_too_large",
        False,
        None,
    )


def test_it_refuses_over_concurrency_until_a_request_finishes():
    b = behaviour(provider(limits=LimitsSpec(concurrency=2)))
    first, second = b.admit(0.0, request(max_tokens=5)), b.admit(0.0, request(max_tokens=5))

    refused = b.admit(0.0, request(max_tokens=5))
    b.finish(1.0, first, 5)
    admitted = b.admit(1.0, request(max_tokens=5))

    assert isinstance(second, Plan)
    assert isinstance(refused, Rejection) and refused.reason == "concurrency"
    assert refused.retry_after_header == 1
    assert isinstance(admitted, Plan)
    assert b.stats()["peak_concurrency"] == 2


def test_it_refuses_the_daily_limit_without_retry_after_until_the_next_day():
    b = behaviour(provider(limits=LimitsSpec(requests_per_day=2)), started_at=1000.0)
    for now in (1000.0, 2000.0):
        b.finish(now, b.admit(now, request(max_tokens=1)), 1)

    refused = b.admit(80000.0, request(max_tokens=1))
    next_day = b.admit(86400.0, request(max_tokens=1))

    assert isinstance(refused, Rejection)
    assert (refused.reason, refused.retryable, refused.retry_after_header) == (
        "requests_per_day",
        False,
        None,
    )
    assert refused.limits.get("requests_per_day").remaining == 0
    assert refused.limits.get("requests_per_day").reset_s == 86400.0 - 80000.0
    assert isinstance(next_day, Plan)


def test_it_debits_nothing_when_one_dimension_refuses():
    b = behaviour(provider(limits=LimitsSpec(requests_per_minute=10, input_tokens_per_minute=100)))
    b.admit(0.0, request(input_tokens=80, max_tokens=1))

    refused = b.admit(0.0, request(input_tokens=80, max_tokens=1))

    assert isinstance(refused, Rejection) and refused.reason == "input_tokens_per_minute"
    assert b.limit_status(0.0).get("requests").remaining == 9
    assert b.in_flight == 1


def test_it_reports_limit_remaining_and_time_to_full():
    b = behaviour(provider(limits=LimitsSpec(requests_per_minute=60, input_tokens_per_minute=6000)))
    b.admit(0.0, request(input_tokens=3000, max_tokens=1))

    status = b.limit_status(0.0)
    later = b.limit_status(15.0)

    assert (status.get("requests").limit, status.get("requests").remaining) == (60, 59)
    assert status.get("requests").reset_s == 1.0
    assert status.get("input_tokens").reset_s == 30.0
    assert later.get("input_tokens").remaining == 4500
    assert status.get("output_tokens") is None  # not configured: no header for it


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=5),  # seconds since the previous request
            st.integers(min_value=1, max_value=900),  # input tokens
            st.integers(min_value=1, max_value=400),  # max_tokens
            st.integers(min_value=0, max_value=400),  # output tokens actually produced
        ),
        min_size=1,
        max_size=60,
    )
)
def test_it_admits_at_exactly_the_retry_after_it_announced(steps):
    limits = ProviderLimits(
        LimitsSpec(
            requests_per_minute=20, input_tokens_per_minute=3000, output_tokens_per_minute=1200
        ),
        now=0.0,
    )
    now, admitted = 0.0, 0
    for gap, input_tokens, max_tokens, produced in steps:
        now += gap
        refusal = limits.try_admit(now, input_tokens, max_tokens)
        if refusal is None:
            admitted += 1
            limits.release(now, max_tokens - min(produced, max_tokens))
            continue
        assert refusal.retryable and refusal.retry_after_s is not None and refusal.retry_after_s > 0
        probe = copy.deepcopy(limits)
        assert probe.try_admit(now + refusal.retry_after_s + 1e-9, input_tokens, max_tokens) is None
        if refusal.retry_after_s > 1e-6:
            early = copy.deepcopy(limits)
            assert (
                early.try_admit(now + refusal.retry_after_s * 0.5, input_tokens, max_tokens)
                is not None
            )
    # The request bucket never lets more through than its burst plus its refill.
    assert admitted <= 20 + now * 20 / 60 + 1e-9
