"""Overrides (SPEC G13): the provider object, model suffixes, tenant sort, fallback models."""

import random

import pytest

from routing.core import (
    EndpointConfig,
    ModelConfig,
    Outcome,
    Router,
    RoutingRequest,
    model_suffix_split,
    provider_preferences_parse,
)

ALL = frozenset({"tools", "response_format", "stream"})
A = EndpointConfig("m@a", "a", "m", 0.5, 0.05, 1.5, 131072, 8192, ALL)
B = EndpointConfig("m@b", "b", "m", 0.8, 0.08, 2.4, 200000, 8192, frozenset({"tools", "stream"}))
C = EndpointConfig("m@c", "c", "m", 0.3, 0.3, 3.0, 65536, 4096, frozenset({"stream"}))
N1 = EndpointConfig("n@a", "a", "n", 0.1, 0.01, 0.3, 32768, 4096)
N2 = EndpointConfig("n@c", "c", "n", 2.0, 2.0, 6.0, 32768, 4096)
SPEED = {"a": (0.45, 70.0), "b": (0.25, 120.0), "c": (0.9, 35.0)}
NOW = 300.0


@pytest.fixture(scope="module")
def router():
    r = Router([ModelConfig("m", (A, B, C)), ModelConfig("n", (N1, N2))])
    for k in range(600):
        t = k * 0.5
        for e in (A, B, C, N1, N2):
            ttft, tps = SPEED[e.provider]
            r.observe(
                e.id,
                Outcome(
                    "ok",
                    latency_s=ttft + 300 / tps,
                    ttft_s=ttft,
                    input_tokens=3000,
                    output_tokens=300,
                ),
                t,
            )
    return r


def plan(router, model="m", seed=0, **kw):
    prefs = kw.pop("provider", None)
    request = RoutingRequest(model, provider=provider_preferences_parse(prefs), **kw)
    return router.plan(request, NOW, random.Random(seed))


def providers(p):
    return [e.provider for e in p.attempts]


def test_it_tries_provider_order_first_then_falls_back_by_price(router):
    p = plan(router, provider={"order": ["c", "a"]})
    assert p.strategy == "order"
    assert providers(p) == ["c", "a", "b"]


def test_it_keeps_only_the_ordered_providers_without_fallbacks(router):
    p = plan(router, provider={"order": ["c", "a"], "allow_fallbacks": False})
    assert providers(p) == ["c", "a"]
    assert ("m@b", "not_in_order") in p.refused


def test_it_plans_a_single_endpoint_when_fallbacks_are_not_allowed(router):
    for seed in range(20):
        p = plan(router, seed=seed, provider={"allow_fallbacks": False})
        assert len(p.attempts) == 1


def test_it_filters_with_only_and_lets_the_algorithm_choose(router):
    p = plan(router, provider={"only": ["a", "b"]})
    assert sorted(providers(p)) == ["a", "b"]
    assert p.strategy == "routing_cost"
    assert ("m@c", "not_in_only") in p.refused


def test_it_drops_ignored_providers(router):
    p = plan(router, provider={"ignore": ["b"]})
    assert "b" not in providers(p)
    assert ("m@b", "ignored") in p.refused


def test_it_sorts_by_effective_price(router):
    p = plan(router, provider={"sort": "price"})
    table = router.table("m", NOW)

    def price(e):
        i = table.index[e.id]
        per_in, per_out = table.price_per_token(i)
        return per_in * p.input_tokens + per_out * p.output_tokens

    prices = [price(e) for e in p.attempts]
    assert prices == sorted(prices) and p.strategy == "price"


def test_it_sorts_by_throughput_and_latency(router):
    assert providers(plan(router, provider={"sort": "throughput"})) == ["b", "a", "c"]
    assert providers(plan(router, provider={"sort": {"by": "latency"}})) == ["b", "a", "c"]


def test_it_reads_floor_and_nitro_suffixes(router):
    assert model_suffix_split("m:floor") == ("m", "price")
    assert model_suffix_split("m:nitro") == ("m", "throughput")
    assert model_suffix_split("org/m:free") == ("org/m:free", None)
    assert plan(router, "m:floor").strategy == "price"
    nitro = plan(router, "m:nitro")
    assert nitro.strategy == "throughput" and providers(nitro) == ["b", "a", "c"]


def test_it_uses_the_tenant_default_sort_unless_the_request_sorts(router):
    assert plan(router, tenant_sort="latency").strategy == "latency"
    assert plan(router, tenant_sort="latency", provider={"sort": "price"}).strategy == "price"


def test_it_excludes_endpoints_above_max_price(router):
    p = plan(router, provider={"max_price": {"prompt": 0.6}})
    assert sorted(providers(p)) == ["a", "c"] and ("m@b", "max_price") in p.refused
    p = plan(router, provider={"max_price": {"completion": 2.0}})
    assert providers(p) == ["a"]


def test_it_requires_parameters_only_when_asked(router):
    asked = plan(
        router, features=frozenset({"response_format"}), provider={"require_parameters": True}
    )
    assert providers(asked) == ["a"]
    assert ("m@b", "unsupported:response_format") in asked.refused
    # n's endpoints declare nothing: a stream is sent to them unless parameters are required.
    assert sorted(providers(plan(router, "n", features=frozenset({"stream"})))) == ["a", "c"]
    strict = plan(
        router, "n", features=frozenset({"stream"}), provider={"require_parameters": True}
    )
    assert providers(strict) == [] and ("n@a", "unsupported:stream") in strict.refused


def test_it_prefers_tool_capable_endpoints_for_tool_calls(router):
    p = plan(router, features=frozenset({"tools"}))
    assert sorted(providers(p)) == ["a", "b"] and ("m@c", "no_tools") in p.refused


def test_it_sends_a_response_format_only_where_it_is_honoured(router):
    p = plan(router, features=frozenset({"response_format", "tools"}))
    assert providers(p) == ["a"]
    assert {("m@b", "no_response_format"), ("m@c", "no_tools")} <= set(p.refused)
    # No endpoint of n declares response_format: best effort, every endpoint stays.
    assert sorted(providers(plan(router, "n", features=frozenset({"response_format"})))) == [
        "a",
        "c",
    ]


def test_it_deprioritises_but_keeps_slow_or_late_endpoints(router):
    for prefs in ({"preferred_min_throughput": 50}, {"preferred_max_latency": {"p50": 0.6}}):
        for seed in range(10):
            p = plan(router, seed=seed, provider={"sort": "price", **prefs})
            assert providers(p)[-1] == "c" and len(p.attempts) == 3
            assert any(who == "m@c" for who, _ in p.demoted)


def test_it_refuses_endpoints_that_cannot_hold_the_request(router):
    p = plan(router, input_tokens=100000)
    assert ("m@c", "context_window") in p.refused and "c" not in providers(p)
    p = plan(router, max_tokens=6000)
    assert ("m@c", "max_output") in p.refused and "c" not in providers(p)
    assert p.output_tokens <= 6000


def test_it_falls_back_to_the_next_model_after_the_first_models_providers(router):
    p = plan(router, models=("n", "unknown"))
    assert [e.model for e in p.attempts] == ["m", "m", "m", "n", "n"]
    assert ("unknown", "unknown_model") in p.refused


def test_it_sorts_across_models_with_partition_none(router):
    p = plan(router, models=("n",), provider={"sort": {"by": "price", "partition": "none"}})
    assert p.attempts[0] == N1  # the cheap fallback model's endpoint comes first


@pytest.mark.parametrize(
    "bad",
    [
        "fast",
        {"sort": "fastest"},
        {"order": "a"},
        {"only": [1]},
        {"allow_fallbacks": "no"},
        {"max_price": {"prompt": -1}},
        {"sort": {"by": "price", "partition": "all"}},
        {"preferred_min_throughput": {"p42": 3}},
    ],
)
def test_it_rejects_malformed_provider_objects(bad):
    with pytest.raises(ValueError):
        provider_preferences_parse(bad)


def test_it_accepts_fields_it_does_not_act_on():
    prefs = provider_preferences_parse(
        {"data_collection": "deny", "zdr": True, "preferred_min_throughput": {"p90": 40}}
    )
    assert prefs.preferred_min_throughput == 40.0
