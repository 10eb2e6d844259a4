"""Multi-bucket reservations in the pure core: all or nothing, D1 order, shadow buckets,
unsatisfiable requests, pauses, jitter, and the core's independence from Django and Redis."""

from __future__ import annotations

import math
import random
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.core.book import Book
from quotas.core.jitter import jittered, pause_spread
from quotas.core.model import (
    BucketSpec,
    Dimension,
    Grant,
    Outcome,
    Reason,
    Refusal,
    Rule,
    Usage,
    Window,
)

T0 = 1_700_000_000.0
KEY_RPM = BucketSpec("key-rpm", "key:1", Dimension.REQUESTS, Rule.REFILL, 5, 60)
APP_CONC = BucketSpec("app-conc", "app:web", Dimension.CONCURRENCY, Rule.CONCURRENCY, 2)
TENANT_DAY = BucketSpec(
    "tenant-day",
    "tenant:acme",
    Dimension.TOTAL_TOKENS,
    Rule.FIXED_WINDOW,
    10_000,
    window=Window.DAY,
    timezone="America/Los_Angeles",
)
PROVIDER_ITPM = BucketSpec(
    "p-itpm", "provider:alpha", Dimension.INPUT_TOKENS, Rule.REFILL, 4000, 60
)
CHAIN = [KEY_RPM, APP_CONC, TENANT_DAY, PROVIDER_ITPM]
DEMAND = Usage(input_tokens=1000, output_tokens=500)


def levels(book: Book, now: float) -> list[float]:
    return [level.available for level in book.levels(CHAIN, now=now)]


def test_it_takes_from_every_bucket_or_from_none():
    book = Book()
    assert isinstance(book.reserve("a", CHAIN, DEMAND, now=T0, lease_seconds=30), Grant)
    assert isinstance(book.reserve("b", CHAIN, DEMAND, now=T0, lease_seconds=30), Grant)
    before = levels(book, T0)
    refusal = book.reserve("c", CHAIN, DEMAND, now=T0, lease_seconds=30)
    assert isinstance(refusal, Refusal)
    assert (refusal.bucket, refusal.reason) == ("app-conc", Reason.BUCKET_EXHAUSTED)
    assert levels(book, T0) == before  # nothing was taken anywhere


def test_it_names_the_narrowest_refusing_bucket_and_the_latest_retry():
    book = Book()
    book.reserve("a", CHAIN, Usage(input_tokens=4000), now=T0, lease_seconds=30)
    book.reserve("b", CHAIN, Usage(input_tokens=0), now=T0, lease_seconds=30)
    refusal = book.reserve("c", CHAIN, Usage(input_tokens=2000), now=T0 + 1, lease_seconds=30)
    assert isinstance(refusal, Refusal)
    assert refusal.bucket == "app-conc"  # key → app → tenant → provider: app refuses first
    assert [r.bucket for r in refusal.refusals] == ["app-conc", "p-itpm"]
    # Both must fit: the provider refills 2000 input tokens in 30 s, the app frees at T0 + 30.
    assert refusal.retry_at == max(T0 + 30, T0 + 1 + (2000 - 4000 / 60) * 60 / 4000 + 1e-6)


def test_it_refuses_an_amount_above_capacity_at_once_as_unsatisfiable():
    book = Book()
    book.reserve("a", CHAIN, DEMAND, now=T0, lease_seconds=30)
    book.reserve("b", CHAIN, DEMAND, now=T0, lease_seconds=30)
    refusal = book.reserve("c", CHAIN, Usage(input_tokens=5000), now=T0, lease_seconds=30)
    assert isinstance(refusal, Refusal)
    assert (refusal.bucket, refusal.reason) == ("p-itpm", Reason.UNSATISFIABLE)
    assert math.isinf(refusal.retry_at)


def test_it_counts_shadow_refusals_but_never_refuses_for_a_shadow_bucket():
    shadow = BucketSpec("try-rpm", "key:1", Dimension.REQUESTS, Rule.REFILL, 1, 60, shadow=True)
    book = Book()
    first = book.reserve("a", [KEY_RPM, shadow], Usage(), now=T0, lease_seconds=30)
    second = book.reserve("b", [KEY_RPM, shadow], Usage(), now=T0, lease_seconds=30)
    assert isinstance(first, Grant) and first.shadow_refusals == ()
    assert isinstance(second, Grant)
    assert [(r.bucket, r.reason) for r in second.shadow_refusals] == [
        ("try-rpm", Reason.BUCKET_EXHAUSTED)
    ]
    assert second.parts[1].skipped and second.parts[1].amount == 0  # as if it were live


def test_it_refuses_a_paused_scope_until_the_pause_ends():
    book = Book()
    assert book.pause("provider:alpha", T0 + 20, now=T0) == T0 + 20
    assert book.pause("provider:alpha", T0 + 5, now=T0) == T0 + 20  # pauses only extend
    refusal = book.reserve("a", CHAIN, DEMAND, now=T0 + 1, lease_seconds=30)
    assert isinstance(refusal, Refusal)
    assert (refusal.bucket, refusal.reason, refusal.retry_at) == ("p-itpm", "paused", T0 + 20)
    assert isinstance(book.reserve("b", CHAIN, DEMAND, now=T0 + 20, lease_seconds=30), Grant)


def test_it_releases_everything_and_reconciles_per_dimension():
    book = Book()
    grant = book.reserve("a", CHAIN, DEMAND, now=T0, lease_seconds=30)
    assert isinstance(grant, Grant)
    result = book.settle(grant, Usage(input_tokens=900, output_tokens=800), now=T0 + 2)
    assert result.outcome is Outcome.RECONCILED
    by_bucket = {s.bucket: s for s in result.settlements}
    assert by_bucket["tenant-day"].estimated == 1500 and by_bucket["tenant-day"].charged == 200
    assert by_bucket["p-itpm"].released == 100
    assert by_bucket["app-conc"].released == 1
    assert book.settle(grant, Usage(), now=T0 + 3).outcome is Outcome.CLOSED
    other = book.reserve("b", CHAIN, DEMAND, now=T0 + 3, lease_seconds=30)
    assert isinstance(other, Grant)
    before = levels(book, T0 + 3)
    released = book.settle(other, None, now=T0 + 3)
    assert released.outcome is Outcome.RELEASED
    after = levels(book, T0 + 3)
    assert after[1] == before[1] + 1 and after[2] == before[2] + 1500


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.floats(0, 10), st.integers(0, 3000), st.integers(0, 3000), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_it_conserves_capacity_through_reserve_and_settle(ops):
    """Windowed buckets end at exactly the actual usage charged: nothing lost or created."""
    book, now, charged = Book(), T0, 0.0
    for i, (gap, estimate, actual, dispatched) in enumerate(ops):
        now += gap
        grant = book.reserve(
            f"r{i}", CHAIN, Usage(input_tokens=estimate), now=now, lease_seconds=1e6
        )
        if isinstance(grant, Grant):
            if dispatched:
                book.settle(grant, Usage(input_tokens=actual), now=now)
                charged += actual
            else:
                book.settle(grant, None, now=now)
    day = book.levels([TENANT_DAY, APP_CONC], now=now)
    assert day[0].available == 10_000 - charged
    assert day[1].available == 2


def test_it_jitters_wakeups_within_bounds_never_before_the_pause_end():
    rng = random.Random(7)
    spread = pause_spread(30.0)
    wakeups = [jittered(T0, spread=spread, rng=rng) for _ in range(200)]
    assert spread == 3.0
    assert all(T0 <= w <= T0 + spread for w in wakeups)
    assert len({round(w, 3) for w in wakeups}) > 150


def test_it_imports_no_django_and_no_redis_in_the_core():
    code = (
        "import sys, quotas.core.book, quotas.core.jitter, quotas.core.keys;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'redis')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
