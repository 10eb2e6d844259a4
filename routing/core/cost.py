"""Routing cost (SPEC G1–G8): what one good answer from an endpoint really costs.

For endpoint e and a request of estimated input I and output O tokens (prices per token):

    price_e   = I·((1 − h_e)·p_in + h_e·p_cached) + O·p_out          G3, h_e measured hit rate
    wait_e    = ttft_e + O / tps_e                                     G4, tps_e streaming speed
    attempt_e = price_e + λ·wait_e + μ·ttft_e + r_e·λ·(t429_e + P)     G4–G6
    cost_e    = attempt_e / ((1 − f_e)·(1 − q_e))                      G7, G8

λ (USD per second of waiting) is in the model's own units, anchored on its cheapest endpoint:

    λ = time_value × min_e price_e(Ī, Ō) / median_e wait_e(Ō)          Ī, Ō the typical request

At time_value 1, the time a typical request takes is worth what the cheapest way to serve it
costs. Why the cheapest and not the median price: λ is what the router will pay for a second,
and the price of a second must not rise because an expensive endpoint joined the market. With
the median, a market of a cheap endpoint and a fast one at 2× its price set λ from the fast
one's price (the median of two is their mean), so speed looked worth nearly any premium; with
the cheapest, a fast endpoint at 2× wins only where it saves about as much waiting as the cheap
endpoint's whole price buys. The median wait stays: one slow endpoint must not make every
second cheap. μ = ttft_weight × λ; P = rate_limit_penalty_s; r_e the 429 rate; f_e the provider
fault rate; q_e the bad-output rate (only for requests whose output is checked: tools or
response_format). cost_e is linear in (I, O), so a model's table keeps three coefficients per
endpoint and a request costs three multiply-adds per endpoint.
"""

from __future__ import annotations

from routing.core.catalogue import PER_MILLION, EndpointConfig
from routing.core.parameters import RoutingParameters
from routing.core.stats import EndpointEstimate, ModelFigures, median


def effective_price(
    endpoint: EndpointConfig, *, input_tokens: float, output_tokens: float, cache_hit_rate: float
) -> float:
    """G3: USD an attempt really costs at the endpoint's measured cache-hit rate."""
    per_input = (1.0 - cache_hit_rate) * endpoint.price_input
    per_input += cache_hit_rate * endpoint.price_cached_input
    return (input_tokens * per_input + output_tokens * endpoint.price_output) * PER_MILLION


def wait_seconds(estimate: EndpointEstimate, output_tokens: float) -> float:
    """G4: end-to-end seconds of one attempt (TTFT plus streaming the output)."""
    return estimate.ttft_s + output_tokens / estimate.tokens_per_s


def time_value(
    endpoints: list[EndpointConfig],
    estimates: list[EndpointEstimate],
    figures: ModelFigures,
    params: RoutingParameters,
) -> float:
    """λ in USD per second: the cheapest endpoint's typical price ÷ the median typical
    end-to-end time, × time_value (module docstring)."""
    prices = [
        effective_price(
            e,
            input_tokens=figures.input_tokens,
            output_tokens=figures.output_tokens,
            cache_hit_rate=est.cache_hit_rate,
        )
        for e, est in zip(endpoints, estimates, strict=True)
    ]
    waits = [wait_seconds(est, figures.output_tokens) for est in estimates]
    median_wait = median(waits, 1.0)
    if median_wait <= 0.0:
        return 0.0
    return params.time_value * min(prices, default=0.0) / median_wait


def attempt_coefficients(
    endpoint: EndpointConfig, estimate: EndpointEstimate, lam: float, params: RoutingParameters
) -> tuple[float, float, float]:
    """(a, b, c) with attempt_e = a·I + b·O + c (USD), from the formula in the module docstring."""
    h = estimate.cache_hit_rate
    a = ((1.0 - h) * endpoint.price_input + h * endpoint.price_cached_input) * PER_MILLION
    b = endpoint.price_output * PER_MILLION + lam / estimate.tokens_per_s
    mu = params.ttft_weight * lam
    c = (lam + mu) * estimate.ttft_s
    c += (
        estimate.rate_limited_rate
        * lam
        * (estimate.rate_limit_wait_s + params.rate_limit_penalty_s)
    )
    return a, b, c


def attempts_per_good_answer(
    estimate: EndpointEstimate, params: RoutingParameters, *, output_checked: bool
) -> float:
    """G7/G8: 1 / ((1 − f)·(1 − q)); a 20 % failure rate gives 1.25."""
    cap = params.max_failure_rate
    fault = min(estimate.fault_rate, cap)
    bad = min(estimate.bad_output_rate, cap) if output_checked else 0.0
    return 1.0 / ((1.0 - fault) * (1.0 - bad))


def routing_cost(
    endpoint: EndpointConfig,
    estimate: EndpointEstimate,
    *,
    input_tokens: float,
    output_tokens: float,
    lam: float,
    params: RoutingParameters,
    output_checked: bool = False,
) -> float:
    """G1: USD per good answer (price plus money value of waiting, × expected attempts)."""
    a, b, c = attempt_coefficients(endpoint, estimate, lam, params)
    attempt = a * input_tokens + b * output_tokens + c
    return attempt * attempts_per_good_answer(estimate, params, output_checked=output_checked)
