"""One contract suite for both reservation stores (Redis + Lua, and the in-memory twin).

Every test runs against both through the same synchronous adapter, on an explicit clock.
The last test replays random operation sequences on both and demands identical results:
the Lua and the pure core compute the same floats.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    sent_usage,
)
from tests.quotas.conftest import make_store

T0 = 1_700_000_000.0
RPM = BucketSpec("rpm", "key:1", Dimension.REQUESTS, Rule.REFILL, 3, 60)
CONC = BucketSpec("conc", "app:web", Dimension.CONCURRENCY, Rule.CONCURRENCY, 2)
DAY = BucketSpec(
    "day",
    "tenant:acme",
    Dimension.TOTAL_TOKENS,
    Rule.FIXED_WINDOW,
    5000,
    window=Window.DAY,
    timezone="America/Los_Angeles",
)
SPEND = BucketSpec("spend", "tenant:acme", Dimension.SPEND, Rule.ROLLING_WINDOW, 10, period=18000)
RAMP = BucketSpec("ramp", "provider:beta", Dimension.REQUESTS, Rule.RAMP, 3, period=60, factor=2)
# Anthropic's ITPM: prompt-cache reads do not count (settled on the uncached input).
ITPM = BucketSpec(
    "itpm", "provider:beta", Dimension.INPUT_TOKENS, Rule.REFILL, 20000, 60, cached_input_free=True
)
# Learned (period: regrowth per request, factor: the cut); 8 is only its ceiling.
LEARNED = BucketSpec(
    "learned", "provider:gamma", Dimension.CONCURRENCY, Rule.CONCURRENCY, 8, period=5, factor=0.5
)
ALL = [RPM, CONC, DAY, SPEND, RAMP, ITPM]
DEMAND = Usage(input_tokens=1000, output_tokens=500, spend=1.5)


def avail(store, buckets, now):
    return [level.available for level in store.levels(buckets, now=now)]


def test_it_grants_with_amounts_per_bucket_and_lease_times(store):
    grant = store.reserve("r1", ALL, DEMAND, now=T0)
    assert isinstance(grant, Grant)
    assert (grant.created_at, grant.expires_at) == (T0, T0 + 30)
    assert grant.taken() == {
        "rpm": 1,
        "conc": 1,
        "day": 1500,
        "spend": 1.5,
        "ramp": 1,
        "itpm": 1000,
    }
    assert avail(store, ALL, T0) == [2, 1, 3500, 8.5, 2, 19000]


def test_it_takes_nothing_when_one_bucket_refuses(store):
    store.reserve("r1", ALL, DEMAND, now=T0)
    store.reserve("r2", ALL, DEMAND, now=T0)
    before = avail(store, ALL, T0)
    refusal = store.reserve("r3", ALL, DEMAND, now=T0)
    assert isinstance(refusal, Refusal)
    assert (refusal.bucket, refusal.reason, refusal.retry_at) == (
        "conc",
        "bucket_exhausted",
        T0 + 30,
    )
    assert avail(store, ALL, T0) == before


def test_it_returns_the_same_grant_for_the_same_reservation_id(store):
    first = store.reserve("same", ALL, DEMAND, now=T0)
    again = store.reserve("same", ALL, DEMAND, now=T0 + 1)
    assert isinstance(again, Grant) and again.replayed
    assert (again.created_at, again.expires_at, again.taken()) == (
        first.created_at,
        first.expires_at,
        first.taken(),
    )
    assert avail(store, [RPM, CONC], T0 + 1)[1] == 1  # taken once


def test_it_reconciles_releasing_the_rest_and_charging_overage(store):
    grant = store.reserve("r1", ALL, DEMAND, now=T0)
    result = store.reconcile(
        grant, Usage(input_tokens=3000, output_tokens=100, spend=0.5), now=T0 + 1
    )
    assert result.outcome is Outcome.RECONCILED
    got = {s.bucket: (s.estimated, s.actual, s.released, s.charged) for s in result.settlements}
    assert got["day"] == (1500, 3100, 0, 1600)
    assert got["spend"] == (1.5, 0.5, 1.0, 0)
    assert got["conc"] == (1, 0, 1, 0)
    assert got["itpm"] == (1000, 3000, 0, 2000)
    levels = avail(store, ALL, T0 + 1)
    assert levels[1:4] == [2, 5000 - 3100, 9.5]


def test_it_charges_a_limit_that_ignores_cache_reads_only_the_uncached_input(store):
    grant = store.reserve("r1", ALL, DEMAND, now=T0)
    usage = Usage(input_tokens=3000, output_tokens=100, spend=0.5, cached_input_tokens=2500)
    result = store.reconcile(grant, usage, now=T0 + 1)
    got = {s.bucket: (s.estimated, s.actual, s.released, s.charged) for s in result.settlements}
    assert got["itpm"] == (1000, 500, 500, 0)  # the provider's ITPM: cache reads are free
    assert got["day"] == (1500, 3100, 0, 1600)  # the tenant's tokens: every token counts


def test_it_gives_everything_back_on_release(store):
    store.reserve("r0", [DAY, SPEND, CONC], DEMAND, now=T0)
    before = avail(store, [DAY, SPEND, CONC], T0)
    grant = store.reserve("r1", [DAY, SPEND, CONC], DEMAND, now=T0)
    assert store.release(grant, now=T0 + 1).outcome is Outcome.RELEASED
    assert avail(store, [DAY, SPEND, CONC], T0 + 1) == before


def test_it_keeps_the_request_and_spend_of_a_failed_attempt_the_provider_received(store):
    """F4: the provider counted the call; only its tokens and its slot come back."""
    buckets = [RPM, CONC, DAY, SPEND, ITPM]
    before = avail(store, buckets, T0)
    grant = store.reserve("r1", buckets, DEMAND, now=T0)
    result = store.reconcile(grant, sent_usage(DEMAND), now=T0)
    got = {s.bucket: (s.estimated, s.actual, s.released, s.charged) for s in result.settlements}
    assert got["rpm"] == (1, 1, 0, 0)
    assert got["spend"] == (1.5, 1.5, 0, 0)
    assert got["conc"] == (1, 0, 1, 0)
    assert got["day"] == (1500, 0, 1500, 0)
    assert got["itpm"] == (1000, 0, 1000, 0)
    assert avail(store, buckets, T0) == [before[0] - 1, *before[1:3], before[3] - 1.5, before[4]]


def test_it_settles_unknown_closed_and_expired_reservations_as_safe_noops(store):
    grant = store.reserve("r1", ALL, DEMAND, now=T0)
    ghost = Grant("never", T0, T0 + 30, grant.parts)
    assert store.reconcile(ghost, DEMAND, now=T0).outcome is Outcome.UNKNOWN
    assert store.release(grant, now=T0 + 1).outcome is Outcome.RELEASED
    assert store.release(grant, now=T0 + 2).outcome is Outcome.CLOSED
    late = store.reserve("r2", ALL, DEMAND, now=T0 + 2)
    before = avail(store, [DAY], T0 + 40)
    assert store.reconcile(late, Usage(input_tokens=9), now=T0 + 40).outcome is Outcome.EXPIRED
    assert avail(store, [DAY], T0 + 40) == before  # the estimate stands


def test_it_gives_back_abandoned_concurrency_lazily_and_through_reap(store):
    store.reserve("a", [CONC, DAY], DEMAND, now=T0, lease_seconds=5)
    store.reserve("b", [CONC, DAY], DEMAND, now=T0 + 1, lease_seconds=5)
    assert isinstance(store.reserve("c", [CONC], DEMAND, now=T0 + 4), Refusal)
    # At T0 + 5 the first lease ran out: the reserve script itself expires it.
    assert isinstance(store.reserve("d", [CONC], DEMAND, now=T0 + 5, lease_seconds=5), Grant)
    expired = store.reap(now=T0 + 6.5)
    assert [e.reservation_id for e in expired] == ["a", "b"]
    assert dict(expired[1].taken) == {"conc": 1, "day": 1500}
    assert avail(store, [CONC, DAY], T0 + 6.5) == [1, 2000]  # estimates of a and b stand
    assert store.reap(now=T0 + 7) == []


def test_it_renews_a_lease_so_a_long_stream_keeps_its_slot(store):
    grant = store.reserve("stream", [CONC], Usage(), now=T0, lease_seconds=5)
    for t in (4, 8, 12):
        renewed = store.renew(grant, now=T0 + t, lease_seconds=5)
        assert (renewed.outcome, renewed.expires_at) == (Outcome.RENEWED, T0 + t + 5)
    store.reserve("other", [CONC], Usage(), now=T0 + 13, lease_seconds=5)
    assert isinstance(store.reserve("third", [CONC], Usage(), now=T0 + 14), Refusal)
    assert store.renew(grant, now=T0 + 30, lease_seconds=5).outcome is Outcome.EXPIRED


def test_it_refuses_a_paused_scope_with_the_pause_end(store):
    assert store.pause("provider:beta", T0 + 12.5, now=T0) == T0 + 12.5
    assert store.pause("provider:beta", T0 + 3, now=T0) == T0 + 12.5
    refusal = store.reserve("r1", ALL, DEMAND, now=T0 + 1)
    assert isinstance(refusal, Refusal)
    assert (refusal.bucket, refusal.reason, refusal.retry_at) == ("ramp", Reason.PAUSED, T0 + 12.5)
    assert store.levels([ITPM], now=T0 + 1)[0].paused_until == T0 + 12.5
    assert isinstance(store.reserve("r2", ALL, DEMAND, now=T0 + 12.5), Grant)


def test_it_refuses_unsatisfiable_amounts_at_once(store):
    refusal = store.reserve("big", ALL, Usage(input_tokens=30000), now=T0)
    assert isinstance(refusal, Refusal)
    assert (refusal.bucket, refusal.reason) == ("day", Reason.UNSATISFIABLE)
    assert math.isinf(refusal.retry_at)


def test_it_lowers_a_bucket_from_provider_headers_but_never_raises_it(store):
    assert store.observe(ITPM, remaining=5000, reset_at=T0 + 10, now=T0) == 5000
    assert store.observe(ITPM, remaining=19000, now=T0) == 5000
    # "full again in 55 s" means at most 20000 - 55 × 20000/60 now, whatever remaining says.
    assert store.observe(ITPM, remaining=4000, reset_at=T0 + 55, now=T0) == 20000 - 55 * 20000 / 60
    assert store.observe(DAY, remaining=1000, now=T0) == 1000
    assert store.observe(DAY, remaining=4000, now=T0) == 1000


def test_it_cuts_a_learned_concurrency_limit_at_a_provider_refusal_and_regrows_it(store):
    grants = [
        store.reserve(f"r{i}", [LEARNED], Usage(), now=T0, lease_seconds=600) for i in range(5)
    ]
    # The provider refused r4 with four others in flight; the gateway released it first.
    store.release(grants[4], now=T0 + 1)
    assert store.observe(LEARNED, remaining=0, now=T0 + 1) == 0.5 * 4 - 4
    # Refusals of requests sent before the cut are old news: no second cut. Being full, the
    # limit grows by one request every 5 s.
    assert store.observe(LEARNED, remaining=0, now=T0 + 1.5) == 2 + 0.5 / 5 - 4
    refusal = store.reserve("late", [LEARNED], Usage(), now=T0 + 2)
    assert isinstance(refusal, Refusal) and refusal.reason is Reason.BUCKET_EXHAUSTED
    for grant in grants[:3]:
        store.reconcile(grant, Usage(), now=T0 + 3)
    # With room to spare it does not grow: idle time proves nothing about the provider.
    assert avail(store, [LEARNED], T0 + 3) == [2.4 - 1]
    assert store.levels([LEARNED], now=T0 + 3)[0].capacity == 2.4  # what pages show
    assert avail(store, [LEARNED], T0 + 100) == [2.4 - 1]
    # Full again, it grows again, up to the ceiling.
    store.reserve("busy", [LEARNED], Usage(), now=T0 + 100, lease_seconds=600)
    assert avail(store, [LEARNED], T0 + 110) == [2.4 + 10 / 5 - 2]
    assert avail(store, [LEARNED], T0 + 200) == [8 - 2]


def test_it_learns_nothing_from_a_refusal_with_nothing_in_flight(store):
    assert store.observe(LEARNED, remaining=0, now=T0) == 8
    grant = store.reserve("only", [LEARNED], Usage(), now=T0)
    store.release(grant, now=T0 + 1)
    assert store.observe(LEARNED, remaining=0, now=T0 + 1) == 8


def test_it_grants_conservatively_after_losing_its_state_then_learns(store):
    conc_grant = store.reserve("inflight", [CONC, RPM], Usage(), now=T0, lease_seconds=5)
    store.lose_state()
    # One maximum lease (30 s) of learning: concurrency and windows refuse, refill starts empty.
    refusal = store.reserve("new", [CONC], Usage(), now=T0 + 1)
    assert isinstance(refusal, Refusal)
    assert (refusal.reason, refusal.retry_at) == (Reason.RECOVERING, T0 + 1 + 30)
    assert avail(store, [RPM], T0 + 1) == [0]
    assert avail(store, [RPM], T0 + 21) == [1]
    # The stream in flight renews: the store adopts its lease and counts its slot again.
    assert store.renew(conc_grant, now=T0 + 4, lease_seconds=40).outcome is Outcome.ADOPTED
    assert isinstance(store.reserve("n1", [CONC], Usage(), now=T0 + 31), Grant)
    assert isinstance(store.reserve("n2", [CONC], Usage(), now=T0 + 31), Refusal)
    assert store.release(conc_grant, now=T0 + 32).outcome is Outcome.RELEASED
    assert isinstance(store.reserve("n3", [CONC], Usage(), now=T0 + 32), Grant)


# -- a stream's reservation in steps (C10): extend ------------------------------------------

OUT = BucketSpec("out", "provider:beta", Dimension.OUTPUT_TOKENS, Rule.REFILL, 2000, 60)
HOUR = BucketSpec(
    "hour", "tenant:acme", Dimension.OUTPUT_TOKENS, Rule.FIXED_WINDOW, 5000, window=Window.HOUR
)
STEPPED = [RPM, CONC, DAY, SPEND, OUT]
FIRST = Usage(input_tokens=1000, output_tokens=256, spend=0.5)
STEP = Usage(requests=0.0, output_tokens=256, spend=0.25, concurrency=0.0)


def test_it_extends_a_live_lease_in_every_dimension_its_output_counts_in(store):
    grant = store.reserve("s1", STEPPED, FIRST, now=T0)
    result = store.extend(grant, STEP, now=T0)
    assert result.outcome is Outcome.EXTENDED
    extended = result.grant
    assert extended.taken() == {"rpm": 1, "conc": 1, "day": 1512, "spend": 0.75, "out": 512}
    assert (extended.created_at, extended.expires_at) == (T0, T0 + 30)  # the lease is as it was
    # Requests and the concurrency slot are taken once; the output step in every token and
    # spend bucket.
    assert avail(store, STEPPED, T0) == [2, 1, 5000 - 1512, 10 - 0.75, 2000 - 512]
    # The final settle reconciles against all it took: the buckets hold the real usage.
    settled = store.reconcile(
        extended, Usage(input_tokens=900, output_tokens=600, spend=0.9), now=T0
    )
    got = {s.bucket: (s.estimated, s.actual, s.released, s.charged) for s in settled.settlements}
    assert got["out"] == (512, 600, 0, 88)
    assert got["day"] == (1512, 1500, 12, 0)
    assert avail(store, STEPPED, T0)[1:] == [2, 5000 - 1500, 10 - 0.9, 2000 - 600]


# OpenAI's TPM and Anthropic's OTPM count max_tokens when they accept a call.
OTPM = BucketSpec(
    "otpm", "provider:beta", Dimension.OUTPUT_TOKENS, Rule.REFILL, 2000, 60, counts_max_output=True
)


def test_it_holds_a_stepped_streams_maximum_where_the_provider_counts_max_tokens(store):
    first = dataclasses.replace(FIRST, output_max=1024)
    grant = store.reserve("s1", [OTPM, HOUR, DAY], first, now=T0)
    # The provider's bucket takes the maximum at once, ours the first step (day: 1000 + 256).
    assert grant.taken() == {"otpm": 1024, "hour": 256, "day": 1256}
    extended = store.extend(grant, STEP, now=T0).grant
    assert extended.taken() == {"otpm": 1024, "hour": 512, "day": 1512}
    # A stream larger than the provider's bucket is refused there at once, as the provider would.
    refused = store.reserve("s2", [OTPM, HOUR], dataclasses.replace(FIRST, output_max=4000), now=T0)
    assert isinstance(refused, Refusal)
    assert (refused.bucket, refused.reason) == ("otpm", Reason.UNSATISFIABLE)
    store.reconcile(extended, Usage(input_tokens=1000, output_tokens=300), now=T0)
    assert avail(store, [OTPM, HOUR, DAY], T0) == [2000 - 300, 5000 - 300, 5000 - 1300]


def test_it_settles_a_lease_against_its_steps_whichever_grant_the_caller_holds(store):
    first = store.reserve("s1", [OUT, DAY], FIRST, now=T0)
    store.extend(first, STEP, now=T0)
    store.extend(first, STEP, now=T0)  # the caller kept the first grant: the record counts
    store.reconcile(first, Usage(input_tokens=1000, output_tokens=100), now=T0)
    assert avail(store, [OUT, DAY], T0) == [2000 - 100, 5000 - 1100]


def test_it_refuses_an_extension_all_or_nothing_and_the_lease_still_settles(store):
    grant = store.reserve("s1", STEPPED, FIRST, now=T0)
    store.reserve("other", [OUT], Usage(output_tokens=1600), now=T0)
    before = avail(store, STEPPED, T0)
    result = store.extend(grant, STEP, now=T0)
    assert result.outcome is Outcome.REFUSED and result.grant is None
    refusal = result.refusal
    assert (refusal.bucket, refusal.reason) == ("out", Reason.BUCKET_EXHAUSTED)
    assert refusal.retry_at == T0 + (256 - 144) * 60 / 2000 + 1e-6
    assert avail(store, STEPPED, T0) == before  # no partial take: day and spend untouched
    # The answer was not cut: it settles its real usage, more than it holds (debt allowed).
    settled = store.reconcile(grant, Usage(input_tokens=1000, output_tokens=400), now=T0)
    got = {s.bucket: (s.estimated, s.actual, s.charged) for s in settled.settlements}
    assert got["out"] == (256, 400, 144)
    assert avail(store, [OUT], T0) == [2000 - 1600 - 400]


def test_it_takes_nothing_for_a_lease_that_no_longer_holds(store):
    grant = store.reserve("s1", STEPPED, FIRST, now=T0)
    store.reconcile(grant, Usage(input_tokens=1000, output_tokens=100), now=T0 + 1)
    before = avail(store, STEPPED, T0 + 1)
    # A step that lands after the settle (its answer came back late) is a no-op.
    assert store.extend(grant, STEP, now=T0 + 1).outcome is Outcome.CLOSED
    assert avail(store, STEPPED, T0 + 1) == before
    late = store.reserve("s2", [OUT], FIRST, now=T0 + 1)
    assert store.extend(late, STEP, now=T0 + 31).outcome is Outcome.EXPIRED
    ghost = Grant("never", T0, T0 + 30, late.parts)
    assert store.extend(ghost, STEP, now=T0 + 31).outcome is Outcome.UNKNOWN
    assert avail(store, [OUT], T0 + 31) == [2000]  # refilled: the ghost took nothing


def test_it_keeps_a_step_taken_before_a_window_reset_counted_in_that_window(store):
    boundary = (T0 // 3600 + 1) * 3600
    grant = store.reserve("s1", [HOUR], FIRST, now=boundary - 1)
    result = store.extend(grant, STEP, now=boundary + 1)  # the next step lands in a new hour
    assert result.grant.taken() == {"hour": 512}
    assert avail(store, [HOUR], boundary + 1) == [5000 - 256]
    settled = store.reconcile(result.grant, Usage(output_tokens=300), now=boundary + 2)
    # The new hour counts what the stream made beyond its first step (300 − 256), not the
    # whole step: the first step stays counted in the hour it was taken in.
    assert avail(store, [HOUR], boundary + 2) == [5000 - 44]
    assert {s.bucket: (s.estimated, s.actual, s.released) for s in settled.settlements} == {
        "hour": (512, 300, 212)
    }


def test_it_skips_a_shadow_bucket_that_would_refuse_an_extension(store):
    trial = BucketSpec(
        "trial", "app:web", Dimension.OUTPUT_TOKENS, Rule.REFILL, 300, 60, shadow=True
    )
    grant = store.reserve("s1", [OUT, trial], FIRST, now=T0)
    result = store.extend(grant, STEP, now=T0)
    assert result.outcome is Outcome.EXTENDED
    assert result.grant.taken() == {"out": 512, "trial": 256}
    assert [r.bucket for r in result.grant.shadow_refusals] == ["trial"]


def test_it_charges_usage_that_bypassed_reservation(store):
    store.charge([(DAY, 4000.0), (SPEND, 2.0), (RPM, 5.0)], now=T0)
    assert avail(store, [DAY, SPEND, RPM], T0) == [1000, 8, -2]


# -- the Lua and the core agree exactly -------------------------------------------------

op = st.one_of(
    st.tuples(st.just("reserve"), st.floats(0, 900), st.integers(0, 6000), st.floats(0, 4)),
    st.tuples(st.just("reconcile"), st.floats(0, 60), st.integers(0, 9000), st.floats(0, 4)),
    st.tuples(st.just("release"), st.floats(0, 60), st.just(0), st.just(0.0)),
    st.tuples(st.just("renew"), st.floats(0, 30), st.just(0), st.just(0.0)),
    st.tuples(st.just("extend"), st.floats(0, 400), st.integers(0, 3000), st.floats(0, 2)),
    st.tuples(st.just("reap"), st.floats(0, 120), st.just(0), st.just(0.0)),
    st.tuples(st.just("observe"), st.floats(0, 30), st.integers(0, 25000), st.floats(0, 60)),
    st.tuples(st.just("charge"), st.floats(0, 30), st.integers(0, 3000), st.floats(0, 3)),
    st.tuples(st.just("lose"), st.floats(0, 30), st.just(0), st.just(0.0)),
)


REPLAYED = [*ALL, LEARNED]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, min_size=1, max_size=40), start=st.floats(0, 86400 * 3))
def test_it_computes_the_same_results_in_lua_as_in_the_core(runner, ops, start):
    memory, _ = make_store("memory", runner, lease_seconds=20.0, retention_seconds=100.0)
    redis_store, cleanup = make_store("redis", runner, lease_seconds=20.0, retention_seconds=100.0)
    try:
        now = 1_710_000_000.0 + start  # around the 2024 spring DST change
        grants: list[Grant] = []
        for i, (kind, gap, amount, extra) in enumerate(ops):
            now += gap
            results = []
            for s in (memory, redis_store):
                if kind == "reserve":
                    demand = Usage(input_tokens=amount, output_tokens=amount / 2, spend=extra)
                    results.append(s.reserve(f"r{i % 7}", REPLAYED, demand, now=now))
                elif kind in ("reconcile", "release", "renew", "extend") and grants:
                    g = grants[-1 - i % min(3, len(grants))]
                    if kind == "reconcile":
                        usage = Usage(
                            input_tokens=amount,
                            output_tokens=amount / 3,
                            spend=extra,
                            cached_input_tokens=amount * (extra % 1.0),
                        )
                        results.append(s.reconcile(g, usage, now=now))
                    elif kind == "release":
                        results.append(s.release(g, now=now))
                    elif kind == "extend":
                        more = Usage(requests=0, output_tokens=amount, spend=extra, concurrency=0)
                        results.append(s.extend(g, more, now=now))
                    else:
                        results.append(s.renew(g, now=now, lease_seconds=20.0))
                elif kind == "reap":
                    results.append(s.reap(now=now, limit=3))
                elif kind == "lose":
                    s.lose_state()
                elif kind == "observe":
                    spec = REPLAYED[i % len(REPLAYED)]
                    remaining = amount % 3 if spec is LEARNED else amount
                    results.append(
                        s.observe(spec, remaining=remaining, reset_at=now + extra, now=now)
                    )
                elif kind == "charge":
                    s.charge([(DAY, float(amount)), (SPEND, extra), (ITPM, float(amount))], now=now)
                results.append(s.levels(REPLAYED, now=now))
            half = len(results) // 2
            assert results[:half] == results[half:], (kind, i)
            if kind == "reserve" and isinstance(results[0], Grant):
                grants.append(results[0])
    finally:
        cleanup()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    groups=st.lists(
        st.lists(op.filter(lambda o: o[0] != "lose"), min_size=1, max_size=6),
        min_size=1,
        max_size=8,
    ),
    start=st.floats(0, 86400 * 3),
)
def test_calls_sent_together_compute_what_they_compute_one_by_one(runner, groups, start):
    """Calls made at once reach Redis in batches (quotas/store/library.py, lua/batch.lua): the
    in-memory twin, called one by one, agrees."""
    memory, _ = make_store("memory", runner, lease_seconds=20.0, retention_seconds=100.0)
    redis_store, cleanup = make_store("redis", runner, lease_seconds=20.0, retention_seconds=100.0)
    library = redis_store.store.library
    sizes: list[int] = []
    send = library._batch

    async def counted(batch):
        sizes.append(len(batch))
        return await send(batch)

    library._batch = counted
    try:
        now = 1_710_000_000.0 + start
        grants: list[Grant] = []
        batched_calls = 0
        i = 0
        for group in groups:
            calls: list[tuple[str, tuple, dict]] = []
            for kind, gap, amount, extra in group:
                now += gap / 10
                i += 1
                at = {"now": now}
                if kind == "reserve":
                    demand = Usage(input_tokens=amount, output_tokens=amount / 2, spend=extra)
                    calls.append(("reserve", (f"r{i % 7}", REPLAYED, demand), at))
                elif kind in ("reconcile", "release", "renew", "extend") and grants:
                    g = grants[-1 - i % min(3, len(grants))]
                    if kind == "reconcile":
                        usage = Usage(input_tokens=amount, output_tokens=amount / 3, spend=extra)
                        calls.append(("reconcile", (g, usage), at))
                    elif kind == "release":
                        calls.append(("release", (g,), at))
                    elif kind == "extend":
                        more = Usage(requests=0, output_tokens=amount, spend=extra, concurrency=0)
                        calls.append(("extend", (g, more), at))
                    else:
                        calls.append(("renew", (g,), {**at, "lease_seconds": 20.0}))
                elif kind == "reap":
                    calls.append(("reap", (), {**at, "limit": 3}))
                elif kind == "observe":
                    spec = REPLAYED[i % len(REPLAYED)]
                    remaining = amount % 3 if spec is LEARNED else amount
                    calls.append(("observe", (spec,), {**at, "remaining": remaining,
                                                       "reset_at": now + extra}))  # fmt: skip
                elif kind == "charge":
                    charges = [(DAY, float(amount)), (SPEND, extra), (ITPM, float(amount))]
                    calls.append(("charge", (charges,), at))
            calls.append(("levels", (REPLAYED,), {"now": now}))
            # The first goes alone; those that wait for it go as one batch if two or more.
            batched_calls += len(calls) - 1 if len(calls) >= 3 else 0

            async def together(store, calls=calls):
                return await asyncio.gather(*(getattr(store, m)(*a, **k) for m, a, k in calls))

            one_by_one = runner.run(together(memory.store))  # no awaits: in order, one by one
            batched = runner.run(together(redis_store.store))
            assert batched == one_by_one, group
            grants += [r for r in one_by_one if isinstance(r, Grant)]
        assert sum(sizes) >= batched_calls  # (a renew that must send definitions calls twice)
    finally:
        library._batch = send
        cleanup()
