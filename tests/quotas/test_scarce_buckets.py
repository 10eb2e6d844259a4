"""What admission tells the router's shadow prices of a fast try's refusal (issue 17,
``routing.core.scarcity``): which of the provider's buckets refused, as plain data; a pool busy
with waiters names none; a pause, a lost state, a too-large request or the caller's own limit
are no sign of scarcity."""

from quotas.core.fairqueue import QueueReason, QueueRefusal, scarce_buckets
from quotas.core.model import BucketRefusal, BucketSpec, Dimension, Reason, Rule

NOW = 1000.0
INPUT = BucketSpec("itpm", "provider:1", Dimension.INPUT_TOKENS, Rule.REFILL, 400000, 60)
SPEND = BucketSpec("spend", "provider:1", Dimension.SPEND, Rule.ROLLING_WINDOW, 40, 18000)
SLOTS = BucketSpec("slots", "provider:1", Dimension.CONCURRENCY, Rule.CONCURRENCY, 24)
PROVIDER = (INPUT, SPEND, SLOTS)


def refused(*refusals, reason=Reason.BUCKET_EXHAUSTED, bucket=None):
    name = bucket if bucket is not None else (refusals[0].bucket if refusals else "")
    return QueueRefusal("r", NOW, reason, name, NOW + 1.0, "", tuple(refusals))


def test_it_names_every_provider_bucket_that_refused_with_its_dimension():
    refusal = refused(
        BucketRefusal("spend", Reason.BUCKET_EXHAUSTED, NOW + 60.0),
        BucketRefusal("slots", Reason.BUCKET_EXHAUSTED, NOW + 0.5),
    )
    assert scarce_buckets(refusal, PROVIDER) == (("spend", "spend"), ("slots", "concurrency"))


def test_a_ramp_limit_is_scarcity_too():
    ramp = BucketSpec("ramp", "provider:1", Dimension.REQUESTS, Rule.RAMP, 10, 60)
    refusal = refused(BucketRefusal("ramp", Reason.RAMP_LIMITED, NOW + 5.0))
    assert scarce_buckets(refusal, (*PROVIDER, ramp)) == (("ramp", "requests"),)


def test_a_pool_busy_with_waiters_is_refused_naming_no_bucket():
    refusal = refused(reason=QueueReason.QUEUE_FULL)
    assert scarce_buckets(refusal, PROVIDER) == ()


def test_a_drain_past_the_deadline_names_the_drained_bucket():
    refusal = refused(reason=QueueReason.DEADLINE_UNREACHABLE, bucket="itpm")
    assert scarce_buckets(refusal, PROVIDER) == (("itpm", "input_tokens"),)


def test_a_pause_a_lost_state_or_a_too_large_request_is_no_scarcity():
    paused = refused(BucketRefusal("slots", Reason.PAUSED, NOW + 7.0), reason=Reason.PAUSED)
    assert scarce_buckets(paused, PROVIDER) is None
    lost = refused(BucketRefusal("itpm", Reason.RECOVERING, NOW + 2.0), reason=Reason.RECOVERING)
    assert scarce_buckets(lost, PROVIDER) is None
    assert scarce_buckets(refused(reason=Reason.UNSATISFIABLE, bucket="itpm"), PROVIDER) is None
    assert scarce_buckets(refused(reason=QueueReason.DEADLINE), PROVIDER) is None


def test_the_callers_own_limit_says_nothing_of_the_provider():
    # Admission passes only the provider's buckets: a tenant bucket refusing is not among them.
    refusal = refused(BucketRefusal("tenant-tpm", Reason.BUCKET_EXHAUSTED, NOW + 30.0))
    assert scarce_buckets(refusal, PROVIDER) is None
