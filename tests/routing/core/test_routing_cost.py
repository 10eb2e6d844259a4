"""Routing cost (SPEC G1–G8): effective price, waiting, 429s, failures, bad output."""

import math
import random
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from routing.core import EndpointConfig, ModelConfig, Outcome, Router, RoutingRequest
from routing.core.cost import effective_price, routing_cost, time_value
from routing.core.legacy import price_only_shares
from routing.core.parameters import RoutingParameters
from routing.core.stats import EndpointEstimate, ModelFigures

P = RoutingParameters()
EP = EndpointConfig(
    id="m@a",
    provider="a",
    model="m",
    price_input=0.5,
    price_cached_input=0.05,
    price_output=1.5,
    context_window=131072,
    max_output=8192,
)
EST = EndpointEstimate(
    ttft_s=0.5,
    tokens_per_s=80.0,
    cache_hit_rate=0.3,
    fault_rate=0.01,
    rate_limited_rate=0.02,
    bad_output_rate=0.01,
    rate_limit_wait_s=0.3,
    backoff_failure_rate=0.0,
    attempt_rate=0.0,
    cap_rps=0.0,
)
LAM = 0.0004


def cost(endpoint=EP, estimate=EST, *, checked=False, lam=LAM, params=P, i=3000.0, o=400.0):
    return routing_cost(
        endpoint,
        estimate,
        input_tokens=i,
        output_tokens=o,
        lam=lam,
        params=params,
        output_checked=checked,
    )


up = st.floats(min_value=1e-3, max_value=50.0)


@given(up)
def test_it_costs_more_with_a_higher_price(extra):
    for field in ("price_input", "price_cached_input", "price_output"):
        dearer = replace(EP, **{field: getattr(EP, field) + extra})
        assert cost(dearer) > cost()


@given(up)
def test_it_costs_more_with_a_longer_ttft(extra):
    assert cost(estimate=EST._replace(ttft_s=EST.ttft_s + extra)) > cost()


@given(st.floats(min_value=1e-3, max_value=0.9))
def test_it_costs_more_with_more_faults_and_429s(extra):
    assert cost(estimate=EST._replace(fault_rate=min(0.95, EST.fault_rate + extra))) > cost()
    assert cost(estimate=EST._replace(rate_limited_rate=EST.rate_limited_rate + extra)) > cost()


@given(st.floats(min_value=1.0, max_value=1000.0))
def test_it_costs_less_with_faster_streaming(faster):
    assert cost(estimate=EST._replace(tokens_per_s=EST.tokens_per_s + faster)) < cost()


def test_it_charges_exactly_one_and_a_quarter_attempts_for_one_failure_in_five():
    perfect = EST._replace(fault_rate=0.0, bad_output_rate=0.0)
    assert math.isclose(
        cost(estimate=perfect._replace(fault_rate=0.2)), 1.25 * cost(estimate=perfect)
    )
    # Bad output counts only where output is checked (tools / response_format).
    bad = perfect._replace(bad_output_rate=0.2)
    assert math.isclose(cost(estimate=bad, checked=True), 1.25 * cost(estimate=perfect))
    assert math.isclose(cost(estimate=bad, checked=False), cost(estimate=perfect))


def test_it_spells_out_the_formula():
    est = EST
    h, i, o = est.cache_hit_rate, 3000.0, 400.0
    price = (i * ((1 - h) * 0.5 + h * 0.05) + o * 1.5) / 1e6
    wait = est.ttft_s + o / est.tokens_per_s
    attempt = price + LAM * wait + P.ttft_weight * LAM * est.ttft_s
    attempt += est.rate_limited_rate * LAM * (est.rate_limit_wait_s + P.rate_limit_penalty_s)
    expected = attempt / (1 - est.fault_rate)
    assert math.isclose(cost(), expected, rel_tol=1e-12)
    assert math.isclose(
        effective_price(EP, input_tokens=i, output_tokens=o, cache_hit_rate=h), price
    )


def test_it_anchors_lambda_on_the_cheapest_endpoints_price_over_the_median_time():
    # Typical request: 1000 in, 100 out (ModelFigures' last two), no cache hits.
    figures = ModelFigures(0.5, 80.0, 0.0, 0.01, 0.01, 0.01, 0.3, 1000.0, 100.0)
    eps = [replace(EP, price_input=p, price_cached_input=p) for p in (1.0, 2.0, 9.0)]
    ests = [EST._replace(cache_hit_rate=0.0, ttft_s=t) for t in (0.5, 1.5, 9.5)]
    lam = time_value(eps, ests, figures, P)
    # By hand: the cheapest price is 1000 × $1/M + 100 × $1.5/M = $0.00115; the waits are
    # 0.5 / 1.5 / 9.5 s + 100 / 80 tok/s, their median 2.75 s: λ = 0.00115 / 2.75 $/s.
    assert math.isclose(lam, 0.00115 / 2.75)
    assert math.isclose(time_value(eps, ests, figures, replace(P, time_value=2.0)), 2 * lam)
    # The median price ($0.00215) would have made a second almost twice as dear.
    assert lam < 0.00215 / 2.75 * 0.6
    # An expensive endpoint joining the market does not raise the price of a second.
    dear = [*eps, replace(EP, price_input=50.0, price_cached_input=50.0)]
    assert math.isclose(time_value(dear, [*ests, ests[1]], figures, P), lam)
    # A faster endpoint may charge more and still cost less (G4).
    fast = cost(replace(EP, price_output=2.0), EST._replace(tokens_per_s=200.0), lam=lam)
    assert fast < cost(lam=lam)


def test_it_makes_a_fast_endpoint_at_twice_the_price_earn_its_premium():
    # Two endpoints, the fast one at 2x the price: only a large saving of time makes it win.
    figures = ModelFigures(0.4, 100.0, 0.0, 0.0, 0.0, 0.0, 0.3, 1000.0, 200.0)
    cheap = replace(EP, price_input=1.0, price_cached_input=1.0, price_output=2.0)
    fast = replace(EP, price_input=2.0, price_cached_input=2.0, price_output=4.0)
    calm = EST._replace(
        cache_hit_rate=0.0, fault_rate=0.0, rate_limited_rate=0.0, tokens_per_s=100.0
    )
    nearly = [calm._replace(ttft_s=0.5, tokens_per_s=90.0), calm._replace(ttft_s=0.4)]
    lam = time_value([cheap, fast], nearly, figures, P)

    def both(estimates):
        return [
            routing_cost(e, est, input_tokens=1000.0, output_tokens=200.0, lam=lam, params=P)
            for e, est in zip((cheap, fast), estimates, strict=True)
        ]

    # Nearly as fast: a tenth of a second and 10 % more speed do not pay for twice the price.
    slow_cost, fast_cost = both(nearly)
    assert slow_cost < fast_cost
    # Over three times as fast (8.2 s against 2.4 s end to end): it does.
    far = [calm._replace(ttft_s=1.5, tokens_per_s=30.0), calm._replace(ttft_s=0.4)]
    lam = time_value([cheap, fast], far, figures, P)
    slow_cost, fast_cost = both(far)
    assert fast_cost < slow_cost


def test_it_does_not_let_a_tiny_listed_input_price_win():
    honest = EndpointConfig("m@honest", "honest", "m", 0.50, 0.05, 1.50, 131072, 8192)
    gamer = EndpointConfig("m@gamer", "gamer", "m", 0.05, 2.00, 4.00, 131072, 8192)
    router = Router([ModelConfig("m", (honest, gamer))])
    for k in range(200):
        for e in (honest, gamer):
            router.observe(
                e.id,
                Outcome(
                    "ok",
                    latency_s=4.0,
                    ttft_s=0.5,
                    input_tokens=3000,
                    cached_input_tokens=1500,
                    output_tokens=350,
                ),
                k * 0.5,
            )
    now = 100.0
    # The old router, by listed input price, sends almost everything to the gamer …
    assert price_only_shares([0.50, 0.05], [False, False])[1] > 0.98
    # … the effective price and the routing cost see through it.
    rng = random.Random(0)
    price_sorted = router.plan(RoutingRequest("m:floor"), now, rng)
    assert [e.provider for e in price_sorted.attempts] == ["honest", "gamer"]
    table = router.table("m", now)
    assert table is not None
    wins = sum(
        router.plan(RoutingRequest("m"), now, rng).attempts[0].provider == "honest"
        for _ in range(1000)
    )
    assert wins > 950
