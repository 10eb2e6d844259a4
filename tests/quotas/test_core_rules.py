"""Property tests of the bucket rules against simple reference models (SPEC B1, B3, C6 debt).

Time is an argument everywhere: schedules are generated, nothing sleeps.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.core.book import Book
from quotas.core.model import BucketSpec, Dimension, Grant, Refusal, Rule, Usage, Window
from quotas.core.windows import fixed_window_boundaries

T0 = 1_700_000_000.0
EPS = 1e-6

steps = st.lists(st.tuples(st.floats(0.0, 30.0), st.integers(1, 12)), min_size=1, max_size=80)


def requests(amount: float) -> Usage:
    return Usage(requests=amount)


def admit_all(book: Book, spec: BucketSpec, schedule: list[tuple[float, int]]):
    """Run a schedule of (gap, amount) reservations; returns admitted (time, amount)."""
    now, admitted = T0, []
    for i, (gap, amount) in enumerate(schedule):
        now += gap
        result = book.reserve(f"r{i}", [spec], requests(amount), now=now, lease_seconds=1e9)
        if isinstance(result, Grant):
            admitted.append((now, float(amount)))
    return admitted


@settings(max_examples=150, deadline=None)
@given(schedule=steps, capacity=st.integers(1, 20), period=st.floats(1.0, 120.0))
def test_it_never_admits_more_than_capacity_plus_refill_in_any_interval(schedule, capacity, period):
    spec = BucketSpec("rpm", "p", Dimension.REQUESTS, Rule.REFILL, capacity, period)
    admitted = admit_all(Book(), spec, schedule)
    for i, (t0, _) in enumerate(admitted):
        total = 0.0
        for t1, amount in admitted[i:]:
            total += amount
            assert total <= capacity + capacity * (t1 - t0) / period + EPS


@settings(max_examples=150, deadline=None)
@given(schedule=steps, capacity=st.integers(1, 20), period=st.floats(1.0, 120.0))
def test_it_matches_a_reference_token_bucket_and_its_retry_at_is_exact(schedule, capacity, period):
    spec = BucketSpec("rpm", "p", Dimension.REQUESTS, Rule.REFILL, capacity, period)
    book, level, last, now = Book(), float(capacity), T0, T0
    for i, (gap, amount) in enumerate(schedule):
        now += gap
        level = min(capacity, level + (now - last) * capacity / period)
        last = now
        result = book.reserve(f"r{i}", [spec], requests(amount), now=now, lease_seconds=1e9)
        fits = amount <= level + EPS
        if abs(amount - level) > 1e-6:  # away from float ties the decisions agree
            assert isinstance(result, Grant) == fits
        if isinstance(result, Grant):
            level -= amount
        elif amount <= capacity:
            # Retry-After is exact: at retry_at it fits, a hair before it does not.
            assert result.retry_at > now
            # levels() has no side effect on a refill bucket
            assert book.levels([spec], now=result.retry_at)[0].available >= amount
        else:
            assert result.reason == "unsatisfiable" and math.isinf(result.retry_at)


def test_it_charges_overage_as_debt_that_delays_later_admissions():
    spec = BucketSpec("tpm", "p", Dimension.OUTPUT_TOKENS, Rule.REFILL, 1000, 60)
    book = Book()
    grant = book.reserve("a", [spec], Usage(output_tokens=400), now=T0, lease_seconds=30)
    assert isinstance(grant, Grant)
    result = book.settle(grant, Usage(output_tokens=1600), now=T0)
    assert result.settlements[0].charged == 1200
    assert book.levels([spec], now=T0)[0].available == -600  # the bucket went negative
    refusal = book.reserve("b", [spec], Usage(output_tokens=100), now=T0, lease_seconds=30)
    assert isinstance(refusal, Refusal) and refusal.reason == "bucket_exhausted"
    assert refusal.retry_at == T0 + 700 * 60 / 1000 + 1e-6  # 600 debt + 100 needed, + a tick
    assert isinstance(
        book.reserve("c", [spec], Usage(output_tokens=100), now=refusal.retry_at, lease_seconds=30),
        Grant,
    )


ZONES = ["America/Los_Angeles", "Europe/Berlin", "Australia/Sydney", "UTC", "Asia/Kolkata"]
instants = st.floats(T0 - 3 * 365 * 86400, T0 + 3 * 365 * 86400)


@settings(max_examples=300, deadline=None)
@given(now=instants, zone=st.sampled_from(ZONES), window=st.sampled_from(list(Window)))
def test_it_finds_the_fixed_window_around_now_at_local_reset_times(now, zone, window):
    b0, b1, b2, b3 = fixed_window_boundaries(now, window, 0.0, zone)
    assert b0 < b1 <= now < b2 < b3
    tz = ZoneInfo(zone)
    for b in (b0, b1, b2, b3):
        local = datetime.fromtimestamp(b, tz)
        assert (local.minute, local.second) == (0, 0)
        if window is not Window.HOUR:
            assert local.hour == 0
        if window is Window.WEEK:
            assert local.weekday() == 0
        if window is Window.MONTH:
            assert local.day == 1
    if window is Window.DAY:
        for a, b in ((b0, b1), (b1, b2), (b2, b3)):
            assert (b - a) / 3600 in (23.0, 24.0, 24.5, 25.0)  # Lord Howe aside, 23/24/25 h
    # The next window starts where this one ends.
    assert fixed_window_boundaries(b2, window, 0.0, zone)[1] == b2


def test_it_has_23_and_25_hour_days_in_los_angeles_on_dst_changes():
    tz = ZoneInfo("America/Los_Angeles")
    spring = datetime(2024, 3, 10, 12, tzinfo=tz).timestamp()
    autumn = datetime(2024, 11, 3, 12, tzinfo=tz).timestamp()
    _, s1, s2, _ = fixed_window_boundaries(spring, Window.DAY, 0.0, "America/Los_Angeles")
    _, a1, a2, _ = fixed_window_boundaries(autumn, Window.DAY, 0.0, "America/Los_Angeles")
    assert (s2 - s1, a2 - a1) == (23 * 3600, 25 * 3600)


def test_it_resets_a_daily_window_at_local_midnight_across_dst():
    spec = BucketSpec(
        "rpd",
        "p",
        Dimension.REQUESTS,
        Rule.FIXED_WINDOW,
        3,
        window=Window.DAY,
        timezone="America/Los_Angeles",
    )
    tz = ZoneInfo("America/Los_Angeles")
    book = Book()
    day = datetime(2024, 11, 3, 0, 30, tzinfo=tz)  # the 25-hour day
    for i in range(3):
        assert isinstance(
            book.reserve(f"a{i}", [spec], requests(1), now=day.timestamp() + i, lease_seconds=30),
            Grant,
        )
    refusal = book.reserve("x", [spec], requests(1), now=day.timestamp() + 10, lease_seconds=30)
    assert isinstance(refusal, Refusal)
    assert refusal.retry_at == datetime(2024, 11, 4, tzinfo=tz).timestamp()
    assert refusal.retry_at - datetime(2024, 11, 3, tzinfo=tz).timestamp() == 25 * 3600
    late = (datetime(2024, 11, 4, tzinfo=tz) - timedelta(seconds=1)).timestamp()
    assert isinstance(book.reserve("y", [spec], requests(1), now=late, lease_seconds=30), Refusal)
    assert isinstance(book.reserve("z", [spec], requests(1), now=late + 1, lease_seconds=30), Grant)


@settings(max_examples=100, deadline=None)
@given(
    gaps=st.lists(st.tuples(st.floats(0, 20 * 3600), st.integers(1, 4)), min_size=1, max_size=60),
    zone=st.sampled_from(ZONES[:3]),
)
def test_it_never_admits_more_than_capacity_per_fixed_window(gaps, zone):
    spec = BucketSpec(
        "rpd", "p", Dimension.REQUESTS, Rule.FIXED_WINDOW, 5, window=Window.DAY, timezone=zone
    )
    start = datetime(2024, 3, 8, tzinfo=ZoneInfo(zone)).timestamp()
    book, now, per_window = Book(), start, {}
    for i, (gap, amount) in enumerate(gaps):
        now += gap
        if isinstance(
            book.reserve(f"r{i}", [spec], requests(amount), now=now, lease_seconds=1), Grant
        ):
            w = fixed_window_boundaries(now, Window.DAY, 0.0, zone)[1]
            per_window[w] = per_window.get(w, 0) + amount
    assert all(total <= 5 for total in per_window.values())


@settings(max_examples=150, deadline=None)
@given(schedule=steps, capacity=st.integers(1, 20), slices=st.integers(1, 12))
def test_it_matches_a_sliding_log_rounded_up_to_slice_ends(schedule, capacity, slices):
    """The rolling window is exactly a sliding log whose entries count until the end of their
    slice plus the duration: never more than capacity in any window, late by at most D/n."""
    duration = 100.0
    spec = BucketSpec(
        "spend",
        "p",
        Dimension.REQUESTS,
        Rule.ROLLING_WINDOW,
        capacity,
        period=duration,
        slices=slices,
    )
    width = duration / slices
    book, log, now = Book(), [], T0
    for i, (gap, amount) in enumerate(schedule):
        now += gap
        counted = sum(a for t, a in log if (math.floor(t / width) + 1) * width + duration > now)
        result = book.reserve(f"r{i}", [spec], requests(amount), now=now, lease_seconds=1e9)
        assert isinstance(result, Grant) == (counted + amount <= capacity)
        if isinstance(result, Grant):
            log.append((now, float(amount)))
            exact = sum(a for t, a in log if t > now - duration)
            assert exact <= capacity  # the exact sliding log never overflows


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(st.tuples(st.floats(0, 5), st.booleans()), min_size=1, max_size=80),
    capacity=st.integers(1, 5),
)
def test_it_holds_concurrency_until_release_or_lease_expiry(events, capacity):
    spec = BucketSpec("conc", "app", Dimension.CONCURRENCY, Rule.CONCURRENCY, capacity)
    book, now, live = Book(), T0, []
    for i, (gap, release) in enumerate(events):
        now += gap
        live = [g for g in live if g.expires_at > now]  # leases of 10 s run out
        if release and live:
            book.settle(live.pop(0), None, now=now)
            continue
        result = book.reserve(f"r{i}", [spec], Usage(), now=now, lease_seconds=10)
        assert isinstance(result, Grant) == (len(live) < capacity)
        if isinstance(result, Grant):
            live.append(result)
        else:
            assert result.retry_at == max(now, min(g.expires_at for g in live))


@settings(max_examples=150, deadline=None)
@given(
    schedule=st.lists(st.tuples(st.floats(0, 40), st.integers(1, 3)), min_size=1, max_size=120),
    floor=st.integers(1, 10),
    factor=st.floats(1.0, 3.0),
)
def test_it_never_grows_faster_than_the_ramp_factor(schedule, floor, factor):
    spec = BucketSpec("ramp", "p", Dimension.REQUESTS, Rule.RAMP, floor, period=60, factor=factor)
    per_interval: dict[int, float] = {}
    for t, amount in admit_all(Book(), spec, schedule):
        k = math.floor(t / 60)
        per_interval[k] = per_interval.get(k, 0) + amount
    for k, used in per_interval.items():
        assert used <= max(floor, factor * per_interval.get(k - 1, 0.0)) + EPS


def test_it_smooths_a_ramp_to_the_next_interval_instead_of_refusing_forever():
    spec = BucketSpec("ramp", "p", Dimension.REQUESTS, Rule.RAMP, 2, period=60, factor=2)
    book = Book()
    start = math.floor(T0 / 60) * 60.0
    assert all(
        isinstance(
            book.reserve(f"a{i}", [spec], requests(1), now=start + i, lease_seconds=1), Grant
        )
        for i in range(2)
    )
    refusal = book.reserve("b", [spec], requests(1), now=start + 5, lease_seconds=1)
    assert isinstance(refusal, Refusal) and refusal.reason == "ramp_limited"
    assert refusal.retry_at == start + 60
    # Next interval: 2 × 2 = 4 allowed.
    got = [
        book.reserve(f"c{i}", [spec], requests(1), now=start + 61 + i, lease_seconds=1)
        for i in range(5)
    ]
    assert [isinstance(g, Grant) for g in got] == [True] * 4 + [False]


@settings(max_examples=300, deadline=None)
@given(
    now=instants,
    zone=st.sampled_from(ZONES),
    window=st.sampled_from(list(Window)),
    resets_at=st.integers(0, 86399),
)
def test_it_orders_windows_for_any_reset_time_even_inside_a_dst_gap(now, zone, window, resets_at):
    b0, b1, b2, b3 = fixed_window_boundaries(now, window, float(resets_at), zone)
    assert b0 < b1 <= now < b2 < b3
    assert fixed_window_boundaries(b2, window, float(resets_at), zone)[1] == b2
    if window is Window.DAY:
        local = datetime.fromtimestamp(b1, ZoneInfo(zone))
        wall = local.hour * 3600 + local.minute * 60 + local.second
        # A reset time that does not exist that day (spring forward) happens after the gap.
        assert wall == resets_at or 0 < wall - resets_at <= 3600
