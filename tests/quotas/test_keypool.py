"""Key pools (SPEC B2): the choice of key — spread by room, not first-fit — and its health;
and the order of the provider-side scopes (D1). Pure parts, no Redis."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from quotas.broker import (
    AttemptBuckets,
    attempt_scopes,
    key_room,
    observed_buckets,
    refused_scope,
)
from quotas.core.keypool import MIN_WEIGHT, OUT_SECONDS, ROOM_MEMORY_SECONDS, KeyPool, room_left
from quotas.core.model import BucketSpec, Dimension, Grant, GrantPart, Rule, Usage
from quotas.core.observed import LimitObservation, RateLimitInfo
from quotas.snapshot import PROVIDER_SIDE, SCOPE_ORDER, QuotaSnapshot, ScopedBucket
from routing.catalogue import CredentialEntry, EndpointEntry, ProviderEntry
from tests.personas import ACME_WEB

KEYS = ["k1", "k2", "k3", "k4", "k5"]


def firsts(pool: KeyPool, keys: list[str], now: float, draws: int = 5000) -> Counter[str]:
    rng = random.Random(7)
    return Counter(pool.order(keys, now, rng)[0] for _ in range(draws))


def test_fresh_keys_share_the_first_choice_evenly() -> None:
    counts = firsts(KeyPool(), KEYS, now=0.0)

    assert set(counts) == set(KEYS)
    assert all(0.17 < n / 5000 < 0.23 for n in counts.values()), counts


def test_every_order_holds_every_healthy_key_once() -> None:
    pool, rng = KeyPool(), random.Random(1)
    for _ in range(100):
        assert sorted(pool.order(KEYS, 0.0, rng)) == KEYS


def test_a_key_with_little_room_is_chosen_first_in_proportion_to_it() -> None:
    pool = KeyPool()
    pool.granted("k1", 0.1, now=100.0)  # a tenth of its tightest bucket left
    counts = firsts(pool, ["k1", "k2"], now=100.0)

    # weights 0.1 against 1: first about 1 time in 11, never starved, never first-fit.
    assert 0.05 < counts["k1"] / 5000 < 0.14, counts


def test_a_keys_room_is_forgotten_as_it_refills() -> None:
    pool = KeyPool()
    pool.granted("k1", 0.0, now=0.0)

    assert pool.weight("k1", 0.0) == MIN_WEIGHT
    assert pool.weight("k1", ROOM_MEMORY_SECONDS / 2) == pytest.approx(0.5)
    assert pool.weight("k1", ROOM_MEMORY_SECONDS * 3) == 1.0


def test_a_full_key_comes_last_until_its_bucket_has_room_again() -> None:
    pool = KeyPool()
    pool.full("k2", until=10.0, now=0.0)

    assert pool.weight("k2", 5.0) == MIN_WEIGHT
    counts = firsts(pool, ["k1", "k2"], now=5.0)
    assert counts["k1"] > 0.95 * 5000
    pool.granted("k2", None, now=12.0)  # a grant clears it; a key without buckets keeps no room
    assert pool.weight("k2", 12.0) == 1.0


def test_a_refused_key_is_out_of_the_pool_and_returns_after_its_time() -> None:
    pool, rng = KeyPool(), random.Random(3)
    pool.failed("k2", now=0.0, why="401 invalid api key")

    assert not pool.healthy("k2", 1.0)
    assert all("k2" not in pool.order(KEYS, 1.0, rng) for _ in range(200))
    assert pool.usable(KEYS, 1.0) == 4
    assert pool.state("k2").why == "401 invalid api key"
    assert pool.healthy("k2", OUT_SECONDS + 0.1)


def test_with_every_key_out_the_soonest_back_is_tried_first() -> None:
    pool = KeyPool()
    pool.failed("k1", now=5.0, why="401")
    pool.failed("k2", now=0.0, why="403")

    assert pool.order(["k1", "k2"], 6.0, random.Random(0)) == ["k2", "k1"]
    assert pool.usable(["k1", "k2"], 6.0) == 0


def test_room_left_is_the_tightest_share() -> None:
    assert room_left([(30.0, 60.0), (900.0, 1000.0)]) == pytest.approx(0.5)
    assert room_left([(None, 60.0)]) is None
    assert room_left([]) is None


# -- scopes (D1) -----------------------------------------------------------------------------


def spec(name: str, scope: str, dimension: Dimension = Dimension.REQUESTS) -> BucketSpec:
    return BucketSpec(
        name=name, scope=scope, dimension=dimension, rule=Rule.REFILL, capacity=60.0, period=60.0
    )


PRINCIPAL = dataclasses.replace(ACME_WEB, tenant_id=4, tenant_name="t")
KEY = CredentialEntry(id=7, name="key-1", api_key="sk-1", project_id=8)
PROVIDER = ProviderEntry(
    id=9,
    name="alpha",
    protocol="openai",
    base_url="http://x",
    api_key="",
    cache_ttl_seconds=0,
    credentials=(KEY, CredentialEntry(id=10, name="key-2", api_key="sk-2")),
)
ENDPOINT = EndpointEntry(
    id=11,
    key="acme/chat@alpha",
    model_id=12,
    model_slug="acme/chat",
    provider=PROVIDER,
    upstream_model="chat",
    price_input=1.0,
    price_cached_input=1.0,
    price_output=1.0,
    context_window=1000,
    max_output=100,
    supports=frozenset(),
)


def test_an_attempt_reserves_narrowest_first_caller_then_key_project_endpoint_organisation() -> (
    None
):
    kinds = [kind for kind, _ in attempt_scopes(PRINCIPAL, ENDPOINT, 12, KEY)]

    assert kinds == list(SCOPE_ORDER)
    assert SCOPE_ORDER.index("credential") < SCOPE_ORDER.index("project")
    assert SCOPE_ORDER.index("project") < SCOPE_ORDER.index("endpoint")
    assert SCOPE_ORDER.index("endpoint") < SCOPE_ORDER.index("provider")
    assert dict(attempt_scopes(PRINCIPAL, ENDPOINT, 12, KEY))["project"] == 8
    # The account's single key has no scope of its own.
    assert dict(attempt_scopes(PRINCIPAL, ENDPOINT, 12, None))["credential"] is None


def pooled_attempt() -> AttemptBuckets:
    snapshot = QuotaSnapshot(
        workloads={},
        buckets={
            ("provider", 9): (
                ScopedBucket(spec("provider:alpha:requests:1m", "provider:9"), "provider"),
                ScopedBucket(
                    spec("provider:alpha:input:1m", "provider:9", Dimension.INPUT_TOKENS),
                    "provider",
                ),
            ),
            ("endpoint", 11): (
                ScopedBucket(
                    spec(
                        "endpoint:acme/chat@alpha:input:1m", "endpoint:11", Dimension.INPUT_TOKENS
                    ),
                    "endpoint",
                ),
            ),
            ("credential", 7): (
                ScopedBucket(
                    spec("credential:alpha/key-1:requests:1m", "credential:7"), "credential"
                ),
            ),
            ("tenant", 4): (ScopedBucket(spec("tenant:t:requests:1m", "tenant:4"), "tenant"),),
        },
    )
    buckets = snapshot.for_scopes(attempt_scopes(PRINCIPAL, ENDPOINT, 12, KEY))
    return AttemptBuckets(buckets=buckets, provider_scope="provider:9", credential=KEY)


def test_the_snapshot_gives_the_buckets_in_scope_order() -> None:
    attempt = pooled_attempt()

    assert [b.scope_kind for b in attempt.buckets] == [
        "tenant",
        "credential",
        "endpoint",
        "provider",
        "provider",
    ]
    assert {"credential", "project", "endpoint", "provider"} == PROVIDER_SIDE
    assert attempt.is_key_side("credential:alpha/key-1:requests:1m")
    assert not attempt.is_key_side("provider:alpha:requests:1m")
    assert attempt.credential_scope == "credential:7"


def test_headers_describe_the_narrowest_provider_scope_that_limits_their_dimension() -> None:
    attempt = pooled_attempt()

    # requests: the key's own bucket (never the organisation's, never the tenant's)
    assert [s.name for s in observed_buckets(attempt, "requests")] == [
        "credential:alpha/key-1:requests:1m"
    ]
    # input tokens: the key has none; the organisation's limit on this model comes first
    assert [s.name for s in observed_buckets(attempt, "input_tokens")] == [
        "endpoint:acme/chat@alpha:input:1m"
    ]
    assert observed_buckets(attempt, "tokens") == []


def test_a_429_that_the_keys_own_limit_explains_pauses_that_key_only() -> None:
    attempt = pooled_attempt()
    demand = Usage(requests=1.0, input_tokens=500.0, output_tokens=100.0)
    key_out = RateLimitInfo(
        observations=(
            LimitObservation(dimension="requests", limit=60, remaining=0, reset_after=1.0),
            LimitObservation(dimension="input_tokens", limit=9000, remaining=8000, reset_after=1.0),
        )
    )
    org_out = RateLimitInfo(
        observations=(
            LimitObservation(dimension="input_tokens", limit=9000, remaining=10, reset_after=1.0),
        )
    )

    assert refused_scope(attempt, demand, key_out) == "credential:7"
    assert refused_scope(attempt, demand, org_out) == "provider:9"
    assert refused_scope(attempt, demand, RateLimitInfo()) == "provider:9"


def test_key_room_reads_the_keys_own_buckets_of_a_grant() -> None:
    attempt = pooled_attempt()
    parts = tuple(
        GrantPart(b.spec, 1.0, 0.0, False, remaining)
        for b, remaining in zip(attempt.buckets, [50.0, 15.0, 10.0, 5.0, 5.0], strict=True)
    )
    grant = Grant("r1", 0.0, 30.0, parts)

    assert key_room(attempt, grant) == pytest.approx(15.0 / 60.0)
