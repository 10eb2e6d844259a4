"""What admission tells the router of a fast try's refusal (issue 17 item 3): the earliest time
the request could fit, counting only what no settle can hand back sooner."""

import pytest

from quotas.core.fairqueue import QueueReason, QueueRefusal, refusal_floor
from quotas.core.model import BucketRefusal, BucketSpec, Dimension, Reason, Rule

NOW = 1000.0
REQUESTS = BucketSpec("rpm", "provider:1", Dimension.REQUESTS, Rule.REFILL, 600, 60)
INPUT = BucketSpec("itpm", "provider:1", Dimension.INPUT_TOKENS, Rule.REFILL, 400000, 60)
OUTPUT = BucketSpec("otpm", "provider:1", Dimension.OUTPUT_TOKENS, Rule.REFILL, 80000, 60)
SPEND = BucketSpec("spend", "provider:1", Dimension.SPEND, Rule.ROLLING_WINDOW, 40, 18000)
SLOTS = BucketSpec("slots", "provider:1", Dimension.CONCURRENCY, Rule.CONCURRENCY, 64)
BUCKETS = (REQUESTS, INPUT, OUTPUT, SPEND, SLOTS)


def refused(*refusals, reason=Reason.BUCKET_EXHAUSTED, retry_at=NOW + 1.0):
    return QueueRefusal(
        "r", NOW, reason, refusals[0].bucket if refusals else "", retry_at, "", tuple(refusals)
    )


def test_the_floor_is_the_latest_fit_of_the_kept_dimensions():
    # Input tokens fit in 3 s and requests in 1.5 s: not before 3 s. The output bucket's 40 s
    # and the spend window's hour are no floor (settles give most of those reservations back),
    # nor is the concurrency slot (any answer that ends frees one).
    refusal = refused(
        BucketRefusal("rpm", Reason.BUCKET_EXHAUSTED, NOW + 1.5),
        BucketRefusal("itpm", Reason.BUCKET_EXHAUSTED, NOW + 3.0),
        BucketRefusal("otpm", Reason.BUCKET_EXHAUSTED, NOW + 40.0),
        BucketRefusal("spend", Reason.BUCKET_EXHAUSTED, NOW + 3600.0),
        BucketRefusal("slots", Reason.BUCKET_EXHAUSTED, NOW + 0.2),
    )
    assert refusal_floor(refusal, BUCKETS, NOW) == pytest.approx(NOW + 3.0)


def test_only_output_spend_or_slots_refusing_gives_no_floor():
    refusal = refused(
        BucketRefusal("otpm", Reason.BUCKET_EXHAUSTED, NOW + 40.0),
        BucketRefusal("slots", Reason.BUCKET_EXHAUSTED, NOW + 0.2),
    )
    assert refusal_floor(refusal, BUCKETS, NOW) == NOW


def test_a_pause_is_a_floor_whichever_bucket_says_it():
    paused = refused(BucketRefusal("slots", Reason.PAUSED, NOW + 7.0), reason=Reason.PAUSED)
    assert refusal_floor(paused, BUCKETS, NOW) == pytest.approx(NOW + 7.0)
    told = refused(reason=Reason.PAUSED, retry_at=NOW + 4.0)  # no bucket detail
    assert refusal_floor(told, BUCKETS, NOW) == pytest.approx(NOW + 4.0)


def test_a_queue_ahead_or_a_passed_deadline_gives_no_floor():
    assert (
        refusal_floor(refused(reason=QueueReason.QUEUE_FULL, retry_at=NOW + 2), BUCKETS, NOW) == NOW
    )
    assert refusal_floor(refused(reason=QueueReason.DEADLINE, retry_at=NOW), BUCKETS, NOW) == NOW


def test_the_queue_s_own_line_gives_no_floor():
    # E6 (``drain_floor``): the refused tenant's own line will not drain in time. That is its
    # flow's business, told without bucket detail; another tenant's request may well fit.
    line = refused(reason=QueueReason.DEADLINE_UNREACHABLE, retry_at=NOW + 30.0)
    assert refusal_floor(line, BUCKETS, NOW) == NOW
