"""Fallback contracts (SPEC F5, issue 18 item 3): the clause that stops a fallback, and plans
that never hold a fallback outside the route's contract."""

import random
from dataclasses import replace

import pytest

from routing.core import (
    EndpointConfig,
    ModelConfig,
    ProviderPreferences,
    Router,
    RoutingRequest,
    plan_explanation,
)
from routing.core.contracts import (
    OPEN,
    FallbackContract,
    contract_breach,
    contract_narrow,
    contract_parse,
)
from routing.core.stats import Outcome

US = EndpointConfig("m@alpha", "alpha", "m", 1.0, 0.1, 2.0, 131072, 8192, region="us")
EU = EndpointConfig("m@beta", "beta", "m", 1.0, 0.1, 2.0, 131072, 8192, region="eu")
US_DEAR = EndpointConfig("m@gamma", "gamma", "m", 3.0, 0.3, 6.0, 131072, 8192, region="us")
US_SMALL = EndpointConfig(
    "m@delta", "delta", "m", 1.0, 0.1, 2.0, 32768, 8192, region="us", supports=frozenset()
)


def breach(contract, candidate, *, first=US, first_price=1.0, price=1.0):
    return contract_breach(contract, first, first_price, candidate, price)


def test_the_open_contract_allows_any_fallback():
    for candidate in (EU, US_DEAR, US_SMALL):
        assert breach(OPEN, candidate, price=100.0) is None


def test_providers_clause_names_the_provider_and_the_list():
    contract = FallbackContract(providers=frozenset({"alpha", "gamma"}))
    assert breach(contract, US_DEAR) is None
    assert breach(contract, EU) == "provider beta not in [alpha, gamma]"


def test_same_region_compares_with_the_first_choice():
    contract = FallbackContract(same_region=True)
    assert breach(contract, US_DEAR) is None
    assert breach(contract, EU) == "region eu != us"
    assert breach(contract, US, first=EU) == "region us != eu"
    untagged = replace(US, region="")
    assert breach(contract, untagged) == 'region "" != us'


def test_region_list_allows_only_its_tags():
    contract = FallbackContract(regions=frozenset({"us", "ca"}))
    assert breach(contract, US_DEAR) is None
    assert breach(contract, EU) == "region eu not in [ca, us]"


def test_price_ceiling_is_relative_to_the_first_choice():
    contract = FallbackContract(max_price_ratio=1.5)
    assert breach(contract, US_DEAR, first_price=0.002, price=0.003) is None  # exactly 1.5
    assert breach(contract, US_DEAR, first_price=0.002, price=0.006) == "price ratio 3 > 1.5"


def test_latency_ceiling_is_relative_to_the_first_choices_expected_seconds():
    contract = FallbackContract(max_latency_ratio=1.5)
    assert contract_breach(contract, US, 1.0, EU, 1.0, first_wait=2.0, candidate_wait=3.0) is None
    assert (
        contract_breach(contract, US, 1.0, EU, 1.0, first_wait=2.0, candidate_wait=5.0)
        == "latency ratio 2.5 > 1.5"
    )


def test_context_same_or_larger():
    contract = FallbackContract(context_same_or_larger=True)
    assert breach(contract, EU) is None
    assert breach(contract, US_SMALL) == "context window 32768 < 131072"
    assert breach(contract, US, first=US_SMALL) is None  # larger is fine


def test_features_same_needs_what_the_first_choice_supports():
    tools = replace(US, supports=frozenset({"tools", "stream"}))
    contract = FallbackContract(features_same=True)
    assert breach(contract, US_SMALL, first=tools) == (
        "feature tools unsupported (the first choice supports it)"
    )
    assert breach(contract, tools, first=US_SMALL) is None  # more support is fine


def test_the_first_clause_in_order_is_named():
    contract = FallbackContract(providers=frozenset({"alpha"}), same_region=True)
    assert breach(contract, EU).startswith("provider beta")


def test_parse_reads_every_clause():
    contract = contract_parse(
        {
            "providers": ["alpha", "gamma"],
            "regions": "same",
            "max_price_ratio": 1.5,
            "max_latency_ratio": 2,
            "context": "same_or_larger",
            "features": "same",
        }
    )
    assert contract == FallbackContract(
        providers=frozenset({"alpha", "gamma"}),
        same_region=True,
        max_price_ratio=1.5,
        max_latency_ratio=2.0,
        context_same_or_larger=True,
        features_same=True,
    )
    assert contract_parse({"regions": ["eu", "us"]}).regions == frozenset({"eu", "us"})
    assert contract_parse({}) is not None and contract_parse({}).open
    assert contract_parse(None).open


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([], "must be a mapping"),
        ({"region": "same"}, "unknown clause 'region'"),
        ({"providers": "alpha"}, "providers: must be a non-empty list"),
        ({"providers": []}, "providers: must be a non-empty list"),
        ({"providers": [""]}, "providers: every item must be a non-empty string"),
        ({"regions": "eu"}, "regions: must be 'same' or a list"),
        ({"max_price_ratio": 0.9}, "max_price_ratio: must be a number >= 1"),
        ({"max_price_ratio": True}, "max_price_ratio: must be a number >= 1"),
        ({"max_latency_ratio": "2x"}, "max_latency_ratio: must be a number >= 1"),
        ({"context": "larger"}, "context: must be one of any, same_or_larger"),
        ({"features": "all"}, "features: must be one of any, same"),
    ],
)
def test_parse_refuses_bad_clauses_clearly(value, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        contract_parse(value)


# The planner: the first choice is fixed by the client's order; the rest are fallbacks.
ORDERED = ProviderPreferences(order=("alpha", "beta", "gamma", "delta"))


def plan(contract, endpoints=(US, EU, US_DEAR, US_SMALL), request_contract=None, **request):
    router = Router([ModelConfig("m", tuple(endpoints), contract=contract)])
    return router.plan(
        RoutingRequest(
            "m",
            input_tokens=1000,
            max_tokens=100,
            provider=ORDERED,
            contract=request_contract,
            **request,
        ),
        10.0,
        random.Random(0),
    )


def test_plan_keeps_every_fallback_under_the_open_contract():
    assert [e.provider for e in plan(OPEN).attempts] == ["alpha", "beta", "gamma", "delta"]


def test_plan_drops_fallbacks_outside_the_contract_and_says_why():
    result = plan(FallbackContract(same_region=True, max_price_ratio=1.5))
    assert [e.provider for e in result.attempts] == ["alpha", "delta"]
    assert len(result.costs) == 2
    assert result.contract_refused == (
        ("m@beta", "region eu != us"),
        ("m@gamma", "price ratio 3 > 1.5"),
    )
    header = plan_explanation(result)
    assert "m@beta:contract(region eu != us)" in header
    assert "m@gamma:contract(price ratio 3 > 1.5)" in header


def test_plan_drops_a_fallback_slower_than_the_latency_ceiling_by_its_measured_speed():
    router = Router(
        [ModelConfig("m", (US, EU, US_DEAR), contract=FallbackContract(max_latency_ratio=2))]
    )
    # Measured: alpha 0.5 s to the first token + 100 tokens at 100/s = 1.5 s for this request;
    # beta 0.7 + 100/50 = 2.7 s (ratio 1.8: allowed); gamma 2.0 + 100/25 = 6.0 s (ratio 4).
    speeds = {"alpha": (0.5, 100.0), "beta": (0.7, 50.0), "gamma": (2.0, 25.0)}
    for k in range(2000):
        for e in (US, EU, US_DEAR):
            ttft, tps = speeds[e.provider]
            answer = Outcome("ok", ttft + 100 / tps, ttft, input_tokens=1000, output_tokens=100)
            router.observe(e.id, answer, k * 0.01)
    request = RoutingRequest(
        "m", input_tokens=1000, output_tokens=100, max_tokens=100, provider=ORDERED
    )

    result = router.plan(request, 20.0, random.Random(0))

    assert [e.provider for e in result.attempts] == ["alpha", "beta"]
    [(who, clause)] = result.contract_refused
    assert (who, clause) == ("m@gamma", "latency ratio 3.99 > 2")  # the priors fade, not gone
    assert result.first_wait == pytest.approx(1.5, rel=0.01)


def test_a_workload_class_contract_narrows_each_clause_to_the_stricter():
    route = contract_parse(
        {"providers": ["alpha", "beta", "gamma"], "regions": ["us", "eu"], "max_price_ratio": 2}
    )
    workload = contract_parse(
        {"providers": ["beta", "gamma", "delta"], "regions": ["eu", "ca"], "max_price_ratio": 1.5,
         "max_latency_ratio": 3, "features": "same"}
    )  # fmt: skip

    narrowed = contract_narrow(route, workload)

    assert narrowed == FallbackContract(
        providers=frozenset({"beta", "gamma"}),  # in both lists
        regions=frozenset({"eu"}),
        max_price_ratio=1.5,  # the lower ceiling
        max_latency_ratio=3.0,  # the route has none: the class's
        features_same=True,
    )
    assert contract_narrow(route, None) is route
    assert contract_narrow(route, OPEN) is route
    assert contract_narrow(OPEN, workload) is workload
    # A class cannot widen its route: an open class clause leaves the route's "same".
    assert contract_narrow(FallbackContract(same_region=True), workload).same_region


def test_plan_keeps_to_the_route_and_the_workload_class_contract_both():
    result = plan(
        FallbackContract(max_price_ratio=1.5), request_contract=FallbackContract(same_region=True)
    )
    assert [e.provider for e in result.attempts] == ["alpha", "delta"]
    assert result.contract_refused == (
        ("m@beta", "region eu != us"),  # the class's clause
        ("m@gamma", "price ratio 3 > 1.5"),  # the route's
    )
    assert result.contract == FallbackContract(same_region=True, max_price_ratio=1.5)


def test_plan_never_drops_the_first_choice():
    # The first choice is the contract's reference, even in a region no fallback may go to.
    result = plan(FallbackContract(regions=frozenset({"eu"})), endpoints=(US, EU, US_DEAR))
    assert [e.provider for e in result.attempts] == ["alpha", "beta"]
    assert result.contract_refused == (("m@gamma", "region us not in [eu]"),)


def test_the_contract_of_the_first_model_covers_fallback_models():
    other = replace(EU, id="n@beta", model="n")
    router = Router(
        [
            ModelConfig("m", (US,), contract=FallbackContract(same_region=True)),
            ModelConfig("n", (other,)),
        ]
    )
    result = router.plan(
        RoutingRequest("m", input_tokens=1000, max_tokens=100, models=("n",)),
        10.0,
        random.Random(0),
    )
    assert [e.id for e in result.attempts] == ["m@alpha"]
    assert result.contract_refused == (("n@beta", "region eu != us"),)


def test_sort_partition_none_applies_the_contract_too():
    other = replace(EU, id="n@beta", model="n", price_input=0.8)  # cheapest: sorted first
    router = Router(
        [
            ModelConfig("m", (US, US_DEAR), contract=FallbackContract(max_price_ratio=1.5)),
            ModelConfig("n", (other,)),
        ]
    )
    prefs = ProviderPreferences(sort="price", sort_partition="none")
    result = router.plan(
        RoutingRequest("m", input_tokens=1000, max_tokens=100, models=("n",), provider=prefs),
        10.0,
        random.Random(0),
    )
    # n@beta is the first choice now; alpha is within 1.5x of it, gamma is not.
    assert [e.id for e in result.attempts] == ["n@beta", "m@alpha"]
    assert [who for who, _ in result.contract_refused] == ["m@gamma"]


def test_a_replan_on_the_fallback_model_keeps_the_first_routes_contract():
    # E2's degrade: the request moves to another model; the first route's contract still holds,
    # its first choice is the reference, and every endpoint of the new plan is a fallback.
    eu_small = replace(EU, id="n@beta", model="n", price_input=0.2, price_output=0.4)
    us_small = replace(US, id="n@alpha", model="n", price_input=0.2, price_output=0.4)
    router = Router(
        [
            ModelConfig("m", (US, US_DEAR), contract=FallbackContract(same_region=True)),
            ModelConfig("n", (eu_small, us_small)),
        ]
    )
    rng = random.Random(0)
    first = router.plan(RoutingRequest("m", input_tokens=1000, max_tokens=100), 10.0, rng)
    reference = first.contract_reference()
    assert reference is not None and reference.first.region == "us"

    degraded = router.plan(
        RoutingRequest("n", input_tokens=1000, max_tokens=100, contract_reference=reference),
        10.0,
        rng,
    )

    assert [e.id for e in degraded.attempts] == ["n@alpha"]
    assert degraded.contract_refused == (("n@beta", "region eu != us"),)


def test_an_open_contract_gives_no_reference_to_keep():
    result = plan(OPEN)
    assert result.contract_reference() is None
