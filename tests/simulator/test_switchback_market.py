"""The simulated market sees the gateway's own buckets, endpoints and prices."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from common import redis as gateway_redis
from configfile import config_parse, config_read
from configfile.apply import config_load
from quotas.core.model import Dimension, Rule
from quotas.snapshot import quota_snapshot_build
from routing.models import Provider
from simulator.model import parse_market_text
from simulator.switchback.market import market_build

from .helpers import REFERENCE_MARKET

REFERENCE_CONFIG = REFERENCE_MARKET.parent / "switchyard.yaml"
ENV = {"ALPHA_API_KEY": "a", "BETA_API_KEY": "b", "GAMMA_API_KEY": "g"}


def build(scale: float = 1.0, headroom_s: float = 1.0):
    return market_build(
        config_parse(config_read(REFERENCE_CONFIG)),
        parse_market_text(REFERENCE_MARKET.read_text()),
        scale=scale,
        rng=random.Random(1),
        headroom_s=headroom_s,
    )


@pytest.fixture
def redis_prefix(settings) -> Iterator[str]:
    prefix = f"sy-test-switchback-{uuid.uuid4().hex[:12]}"
    settings.REDIS_PREFIX = prefix
    yield prefix
    client = gateway_redis.sync_client()
    for name in client.scan_iter(match=f"{prefix}:*"):
        client.delete(name)


@pytest.mark.django_db
def test_it_reserves_in_exactly_the_buckets_the_gateway_loads(redis_prefix):
    config_load(REFERENCE_CONFIG, env=ENV)
    sim = build()
    snapshot = quota_snapshot_build()  # what the gateway reserves in (headroom included)
    for provider in ("alpha", "beta", "gamma"):
        pk = Provider.objects.get(name=provider).pk
        loaded = {b.spec.name: b.spec for b in snapshot.buckets[("provider", pk)]}
        route = next(r for r in sim.routes.values() if r.endpoint.provider == provider)
        simulated = {spec.name: spec for spec in route.buckets}
        assert set(simulated) == set(loaded)
        for name, spec in simulated.items():
            # Same bucket but the scope's hash tag: the gateway names it by primary key.
            assert spec == replace(loaded[name], scope=spec.scope), name
    # Anthropic's ITPM does not count prompt-cache reads; OpenAI's TPM does.
    free = {
        spec.name
        for buckets in snapshot.buckets.values()
        for spec in (b.spec for b in buckets)
        if spec.cached_input_free
    }
    assert free == {"provider:beta:input_tokens:1m"}
    # Both protocols count max_tokens in their output limits when they accept a call; our own
    # (tenant, team, key) output limits count what is reserved.
    counted = {
        (kind, spec.name)
        for (kind, _), buckets in snapshot.buckets.items()
        for spec in (b.spec for b in buckets)
        if spec.counts_max_output
    }
    output_buckets = {
        (kind, spec.name)
        for (kind, _), buckets in snapshot.buckets.items()
        for spec in (b.spec for b in buckets)
        if spec.dimension in (Dimension.OUTPUT_TOKENS, Dimension.TOTAL_TOKENS)
    }
    provider_side = {"provider", "credential", "project", "endpoint"}
    assert counted and counted == {(k, n) for k, n in output_buckets if k in provider_side}


def test_it_prices_endpoints_and_routes_models_as_configured():
    sim = build()
    assert [m.slug for m in sim.models] == ["acme/chat-large", "acme/chat-small"]
    gamma = sim.routes["acme/chat-large@gamma"].endpoint
    assert (gamma.price_input, gamma.price_cached_input, gamma.price_output) == (0.3, 0.3, 3.0)
    assert gamma.supports == frozenset({"stream"}) and gamma.cache_ttl_s == 300.0
    assert sim.routes["acme/chat-large@beta"].upstream == "chat-large-fast"
    assert sim.workload.deadline_s == 10.0 and sim.workload.retry_budget == 2
    # Prompts are capped so that the widest window still fits the answer.
    assert sim.max_input_tokens["acme/chat-large"] == 200_000 - 2048


def test_it_scales_every_capacity_with_the_traffic():
    half = build(scale=0.5, headroom_s=0.0)
    alpha = {s.name: s for s in half.routes["acme/chat-small@alpha"].buckets}
    assert alpha["provider:alpha:requests:1m"].capacity == 300
    assert alpha["provider:alpha:input_tokens:1m"].capacity == 200_000
    assert alpha["provider:alpha:requests:day"].capacity == 100_000
    assert alpha["provider:alpha:concurrency"].capacity == 32
    gamma = {s.name: s for s in half.routes["acme/chat-small@gamma"].buckets}
    assert gamma["provider:gamma:spend:rolling-5h"].capacity == 20.0
    beta = {s.name: s for s in half.routes["acme/chat-large@beta"].buckets}
    ramp = beta["provider:beta:ramp:1m"]
    assert ramp.rule is Rule.RAMP and ramp.capacity == 10 and ramp.factor == 2.0
    assert half.behaviours["gamma"].spec.limits.concurrency == 12
    assert half.behaviours["alpha"].spec.limits.input_tokens_per_minute == 200_000


@pytest.mark.parametrize(
    "market",
    sorted((Path(__file__).parents[2] / "bench" / "markets").glob("*.market.yaml")),
    ids=lambda p: p.name.removesuffix(".market.yaml"),
)
def test_it_loads_each_market_of_the_generality_runs(market):
    """bench/markets/ (results.md there): each market and its gateway config keep loading."""
    config = config_parse(config_read(str(market).replace(".market.yaml", ".config.yaml")))
    parsed = parse_market_text(market.read_text())
    sim = market_build(config, parsed, scale=1.0, rng=random.Random(0))
    assert sim.routes and sim.endpoint_ids
