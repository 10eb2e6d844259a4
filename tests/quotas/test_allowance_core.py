"""An allowance (quotas/core/allowance.py): capacity taken for several requests at once and
granted to them one by one, without Redis, while the buckets have plenty left."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.core.allowance import (
    FIELDS,
    MARGIN_SECONDS,
    Allowance,
    allowance_unit,
    scaled,
    short,
    spare,
    suits,
    usable_until,
)
from quotas.core.model import BucketSpec, Dimension, GrantPart, Rule, Usage, Window

TOKENS = BucketSpec("tokens", "tenant:acme", Dimension.TOTAL_TOKENS, Rule.REFILL, 1000, 60)
SLOTS = BucketSpec("slots", "provider:theta", Dimension.CONCURRENCY, Rule.CONCURRENCY, 100)
DAILY = BucketSpec(
    "daily", "tenant:acme", Dimension.REQUESTS, Rule.FIXED_WINDOW, 10_000, window=Window.DAY
)
ROLLING = BucketSpec(
    "spend", "tenant:acme", Dimension.SPEND, Rule.ROLLING_WINDOW, 50.0, 3600, slices=60
)
DEMAND = Usage(input_tokens=30, output_tokens=20, spend=0.01)

demands = st.builds(
    Usage,
    input_tokens=st.integers(0, 40),
    output_tokens=st.integers(0, 40),
    spend=st.sampled_from([0.0, 0.01, 0.5]),
)


def test_an_allowance_holds_a_request_and_a_slot_each_and_room_for_longer_prompts() -> None:
    """Sized from the request that showed the room, with twice its tokens and spend each: the
    next requests of its set differ a little (their prompts' lengths)."""
    reserved = scaled(allowance_unit(DEMAND), 8)
    assert (reserved.requests, reserved.concurrency) == (8, 8)
    assert (reserved.input_tokens, reserved.output_tokens, reserved.spend) == (480, 320, 0.16)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["take", "settle", "release"]), demands, demands), max_size=40
    )
)
def test_it_grants_only_what_it_holds_and_counts_what_its_requests_used(
    steps: list[tuple[str, Usage, Usage]],
) -> None:
    """Whatever comes and goes: what is in flight, what was used and what is left add up to
    what it reserved (concurrency: in flight and left), a request it cannot cover whole is
    refused with nothing taken, and its reconcile asks for exactly what its requests used."""
    allowance = Allowance(Usage(input_tokens=40, output_tokens=40, spend=0.5), 4, 100.0)
    reserved = allowance.reserved
    in_flight: list[Usage] = []
    used = dict.fromkeys(FIELDS, 0.0)
    for op, demand, actual in steps:
        if op == "take":
            before = dict(allowance.left)
            fits = all(getattr(demand, name) <= before[name] for name in FIELDS)
            assert allowance.take(demand, now=1.0) is fits
            if fits:
                in_flight.append(demand)
            else:
                assert allowance.left == before
        elif in_flight:
            demand = in_flight.pop(0)
            if op == "settle":
                allowance.settle(demand, actual)
                for name in FIELDS:
                    used[name] += 0.0 if name == "concurrency" else getattr(actual, name)
            else:
                allowance.release(demand)
        for name in FIELDS:
            flying = sum(getattr(d, name) for d in in_flight)
            assert allowance.left[name] + flying + used[name] == pytest.approx(
                getattr(reserved, name), abs=1e-9
            )
        assert allowance.in_flight == len(in_flight)
    final = allowance.actual()
    for name in ("requests", "input_tokens", "output_tokens", "spend"):
        assert getattr(final, name) == pytest.approx(used[name], abs=1e-9)
    assert final.concurrency == 0


def test_a_retired_allowance_grants_nothing_and_closes_when_its_last_request_ends() -> None:
    allowance = Allowance(DEMAND, 4, usable_until=100.0)
    assert allowance.take(DEMAND, now=1.0)
    allowance.retired = True
    assert not allowance.take(DEMAND, now=1.0)
    assert not allowance.closable  # one request still in flight
    allowance.settle(DEMAND, DEMAND)
    assert allowance.closable


def test_it_is_spent_when_it_could_not_grant_one_more_request_of_its_size() -> None:
    allowance = Allowance(DEMAND, 2, usable_until=100.0)
    assert allowance.take(DEMAND, now=1.0)
    assert not allowance.spent
    assert allowance.take(Usage(input_tokens=10), now=1.0)  # a smaller one still fits
    assert allowance.spent  # 20 input tokens left: not another 30


def test_it_runs_low_with_a_quarter_of_its_requests_left() -> None:
    """Then its next one is taken (``quotas.allowances``), to come before this one is spent."""
    allowance = Allowance(DEMAND, 8, usable_until=11.0)
    for _ in range(5):
        assert allowance.take(DEMAND, now=10.1)
    assert not allowance.running_low  # 3 of 8 left
    assert allowance.take(DEMAND, now=10.1)
    assert allowance.running_low  # 2 of 8


def test_it_grants_nothing_at_or_after_its_usable_time() -> None:
    allowance = Allowance(DEMAND, 4, usable_until=10.0)
    assert allowance.take(DEMAND, now=9.9)
    assert not allowance.take(DEMAND, now=10.0)


def test_a_request_that_used_more_than_it_asked_leaves_the_allowance_owing() -> None:
    """Overage: the next requests find less left; the reconcile charges all of it."""
    allowance = Allowance(DEMAND, 2, usable_until=10.0)
    assert allowance.take(DEMAND, now=1.0)
    allowance.settle(DEMAND, Usage(input_tokens=30, output_tokens=100, spend=0.01))
    assert allowance.left["output_tokens"] == 40 - 100
    assert not allowance.take(DEMAND, now=1.0)
    assert allowance.actual().output_tokens == 100


def part(spec: BucketSpec, remaining: float, marker: float = 0.0) -> GrantPart:
    return GrantPart(spec, 1.0, marker=marker, remaining=remaining)


def test_an_allowance_is_as_large_as_every_bucket_can_spare_keeping_the_floor() -> None:
    """Of a 10,000-token bucket, 50-token requests: one allowance takes a tenth at most (20
    requests); keeping half, 5,400 left spare 8, 5,049 none (one is not worth it)."""
    big = BucketSpec("big", "tenant:acme", Dimension.TOTAL_TOKENS, Rule.REFILL, 10_000, 60)
    slots = BucketSpec("slots", "provider:theta", Dimension.CONCURRENCY, Rule.CONCURRENCY, 1000)
    assert spare([part(big, 10_000), part(slots, 999)], DEMAND, 64, floor=0.5) == 20
    assert spare([part(big, 10_000), part(slots, 999)], DEMAND, 8, floor=0.5) == 8  # at most
    assert spare([part(big, 5_400), part(slots, 999)], DEMAND, 64, floor=0.5) == 8
    assert spare([part(big, 10_000), part(slots, 507)], DEMAND, 64, floor=0.5) == 7
    assert spare([part(big, 5_049), part(slots, 999)], DEMAND, 64, floor=0.5) == 0
    assert spare([part(big, 5_100), part(slots, 999)], DEMAND, 64, floor=0.5) == 2
    assert spare([], DEMAND, 8, floor=0.5) == 0
    skipped = GrantPart(big, 1.0, skipped=True, remaining=10_000)
    assert spare([skipped], DEMAND, 8, floor=0.5) == 0
    assert spare([GrantPart(big, 1.0, remaining=None)], DEMAND, 8, floor=0.5) == 0


def test_a_bucket_a_grant_left_under_the_floor_is_short() -> None:
    """What tells the process's allowances on it to step aside (quotas.allowances)."""
    parts = [part(TOKENS, 499), part(SLOTS, 50), part(DAILY, 4_999.5)]
    assert short(parts, floor=0.5) == {TOKENS, DAILY}  # 50 of 100 slots: not under half
    assert short([part(TOKENS, 1000)], floor=0.5) == frozenset()
    assert short([GrantPart(TOKENS, 1.0, skipped=True, remaining=0)], floor=0.5) == frozenset()
    assert short([GrantPart(TOKENS, 1.0, remaining=None)], floor=0.5) == frozenset()  # a replay


def test_it_is_not_for_streams_in_steps() -> None:
    """They extend their own reservation as the tokens come."""
    assert suits([TOKENS, SLOTS, DAILY, ROLLING], DEMAND)
    assert not suits([TOKENS], Usage(output_tokens=100, output_max=1000))
    assert not suits([], DEMAND)


def test_it_grants_no_request_past_the_window_slice_or_interval_it_was_taken_in() -> None:
    """A request granted after its allowance's window, slice or ramp interval ended would
    count in one that is gone."""
    created = datetime(2026, 12, 5, 23, 59, 0, tzinfo=UTC).timestamp()
    midnight = datetime(2026, 12, 6, tzinfo=UTC).timestamp()
    assert usable_until([part(TOKENS, 1)], created) == math.inf
    assert usable_until([part(DAILY, 1), part(TOKENS, 1)], created) == midnight - MARGIN_SECONDS
    marker = created // 60  # the rolling window's slice: 60 s wide
    until = usable_until([part(ROLLING, 1, marker=marker)], created)
    assert until == (marker + 1) * 60 - MARGIN_SECONDS
    ramp = BucketSpec("ramp", "provider:theta", Dimension.REQUESTS, Rule.RAMP, 10, 60, factor=2)
    assert usable_until([part(ramp, 1, marker=marker)], created) == until
