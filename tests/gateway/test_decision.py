"""Decision metadata (H1): header syntax and reset times, as pure functions."""

from datetime import UTC, datetime

import pytest

from gateway.decision import BucketState, decision_headers, go_duration, reset_seconds
from quotas.core.model import BucketSpec, Dimension, Rule, Window
from quotas.snapshot import ScopedBucket


def bucket(name, kind="tenant", dimension=Dimension.REQUESTS, rule=Rule.REFILL, **spec):
    return ScopedBucket(
        BucketSpec(
            name=name,
            scope=f"{kind}:1",
            dimension=dimension,
            rule=rule,
            capacity=spec.pop("capacity", 100),
            **spec,
        ),
        kind,
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.012, "12ms"),
        (0.9994, "999ms"),
        (1, "1s"),
        (59.2, "1m0s"),
        (360, "6m0s"),
        (3723, "1h2m3s"),
    ],
)
def test_it_writes_resets_in_openais_go_duration_format(seconds, text):
    assert go_duration(seconds) == text


def test_it_measures_resets_per_rule():
    refill = bucket("r", period=60).spec
    assert reset_seconds(refill, remaining=40, now=0) == pytest.approx(36.0)
    daily = bucket("d", rule=Rule.FIXED_WINDOW, window=Window.DAY, timezone="UTC").spec
    noon = datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp()
    assert reset_seconds(daily, remaining=5, now=noon) == 12 * 3600
    assert reset_seconds(bucket("c", rule=Rule.CONCURRENCY).spec, remaining=3, now=0) == 0


def test_it_publishes_only_the_callers_own_buckets_and_picks_the_tightest():
    states = [
        BucketState(bucket("tenant:a:requests:1m", period=60), remaining=90, reset_seconds=6),
        BucketState(bucket("app:a/t/x:requests:1m", kind="app", capacity=10, period=60), 2, 48),
        BucketState(bucket("partner:p:concurrency", kind="partner", rule=Rule.CONCURRENCY), 1, 0),
        BucketState(bucket("provider:alpha:requests:1m", kind="provider", period=60), 0, 60),
    ]
    headers = decision_headers(
        reason="ok", workload="interactive", attempts=1, queue_wait=0.0123, states=states
    )
    assert headers["RateLimit-Policy"] == (
        '"tenant:a:requests:1m";q=100;w=60;qu="requests", '
        '"app:a/t/x:requests:1m";q=10;w=60;qu="requests"'
    )
    assert headers["RateLimit"] == '"app:a/t/x:requests:1m";r=2;t=48'
    assert headers["x-ratelimit-remaining-requests"] == "2"
    assert headers["x-switchyard-queue-wait-ms"] == "12"
    assert "partner" not in str(headers) and "provider" not in str(headers)


def test_it_puts_retry_after_on_a_refusal_in_whole_seconds():
    headers = decision_headers(
        reason="bucket_exhausted",
        workload="partner",
        attempts=0,
        queue_wait=2.0,
        states=[],
        binding_bucket="tenant:a:requests:1m",
        retry_after=0.2,
        queue_id="q-1",
    )
    assert headers["Retry-After"] == "1"
    assert headers["x-switchyard-bucket"] == "tenant:a:requests:1m"
    assert headers["x-switchyard-queue-id"] == "q-1"


def test_it_describes_the_callers_own_limit_that_refused_a_queued_request():
    from gateway.admission import _refusal
    from gateway.call import Call
    from quotas.broker import AttemptBuckets
    from quotas.core.estimate import Demand, EstimationClass
    from quotas.core.fairqueue import QueueReason, QueueRefusal

    app = bucket(
        "app:a/t/x:concurrency", "app", Dimension.CONCURRENCY, Rule.CONCURRENCY, capacity=20
    )
    pool = bucket("provider:alpha:requests:1m", kind="provider", period=60)
    buckets = AttemptBuckets((app, pool), provider_scope="provider:1")
    refused = QueueRefusal("r-1", at=100.0, reason=QueueReason.DEADLINE, bucket=app.spec.name,
                           retry_at=117.0, queue_id="q-1")  # fmt: skip
    demand = Demand(10, 10, EstimationClass("m", "alpha", "f", 0, "none"), 10)
    call = Call()

    error = _refusal(call, refused, demand, buckets)
    headers = decision_headers(
        reason=error.reason, workload="interactive", attempts=0, queue_wait=10.0,
        states=call.bucket_states, binding_bucket=call.binding_bucket, retry_after=17.0,
    )  # fmt: skip

    assert headers["x-switchyard-bucket"] == "app:a/t/x:concurrency"
    assert headers["RateLimit-Policy"] == '"app:a/t/x:concurrency";q=20;qu="concurrent-requests"'
    assert headers["RateLimit"] == '"app:a/t/x:concurrency";r=0;t=17'
    assert headers["Retry-After"] == "17"
    # A shared pool that refused is not the caller's to see (E4).
    call = Call()
    _refusal(call, QueueRefusal("r-2", 100.0, QueueReason.DEADLINE, pool.spec.name, 130.0),
             demand, buckets)  # fmt: skip
    assert call.bucket_states == []


def test_a_new_config_version_of_a_bucket_shows_its_own_policy():
    """Policy items are kept per bucket object: the same name with a new capacity (a new config
    version) is formatted afresh, and the old object still shows its own."""

    def policy(scoped):
        states = [BucketState(scoped, remaining=1, reset_seconds=1)]
        headers = decision_headers(
            reason="ok", workload="w", attempts=1, queue_wait=0, states=states
        )
        return headers["RateLimit-Policy"]

    before = bucket("tenant:a:requests:1m", period=60, capacity=100)
    after = bucket("tenant:a:requests:1m", period=60, capacity=250)
    assert policy(before) == '"tenant:a:requests:1m";q=100;w=60;qu="requests"'
    assert policy(after) == '"tenant:a:requests:1m";q=250;w=60;qu="requests"'
    assert policy(before) == '"tenant:a:requests:1m";q=100;w=60;qu="requests"'
