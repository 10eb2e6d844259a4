"""Demand estimation (C2) and its bounded, learned correction (C11)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotas.core.estimate import (
    MAX_FACTOR,
    MIN_FACTOR,
    Corrections,
    estimation_class,
    input_tokens_heuristic,
    request_estimate,
)

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


def body(text="hello there", **extra):
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def estimate(request, corrections=None, **kwargs):
    options = {"model": "m", "route": "alpha", "default_output_tokens": 400, "max_output": 4096}
    options.update(kwargs)
    return request_estimate(request).demand(corrections=corrections or Corrections(), **options)


def test_it_counts_longer_prompts_tools_and_schemas_as_more_input():
    short = input_tokens_heuristic(body("a" * 40))
    long = input_tokens_heuristic(body("a" * 4000))
    with_tool = input_tokens_heuristic(body("a" * 40, tools=[TOOL]))
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "x",
            "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
        },
    }
    with_schema = input_tokens_heuristic(body("a" * 40, response_format=schema))
    assert long - short == 990  # 3960 more characters at four per token
    assert with_tool > short and with_schema > short


def test_it_reserves_the_requested_max_output_else_the_model_default():
    assert estimate(body(max_tokens=50)).output_tokens == 50
    assert estimate(body(max_completion_tokens=70)).output_tokens == 70
    assert estimate(body()).output_tokens == 400
    assert estimate(body(max_tokens=100_000)).output_tokens == 4096


def test_it_prices_demand_at_uncached_input_so_reconciliation_only_refunds():
    demand = estimate(body("a" * 4000, max_tokens=1000))
    spend = demand.spend(price_input=0.5, price_output=1.5)
    assert spend == (demand.input_tokens * 0.5 + 1000 * 1.5) / 1e6


def test_it_learns_a_consistent_estimation_error():
    corrections = Corrections()
    request = body("a" * 4000)
    first = estimate(request, corrections)
    for _ in range(60):
        corrections.learn(
            first.estimation,
            raw_input=first.raw_input_tokens,
            actual_input=round(first.raw_input_tokens * 1.3),
        )
    learned = estimate(request, corrections).input_tokens
    assert learned == pytest.approx(first.raw_input_tokens * 1.3, rel=0.03)


def test_it_bounds_what_one_odd_request_can_do():
    corrections = Corrections()
    demand = estimate(body("a" * 4000), corrections)
    corrections.learn(
        demand.estimation,
        raw_input=demand.raw_input_tokens,
        actual_input=demand.raw_input_tokens * 100,
    )
    assert 1.0 < corrections.input_factor(demand.estimation) <= 1.25


def test_it_keeps_classes_apart():
    corrections = Corrections()
    plain = estimate(body("a" * 4000), corrections)
    json_mode = estimate(body("a" * 4000, response_format={"type": "json_object"}), corrections)
    other_band = estimate(body("a" * 40000), corrections)
    assert len({plain.estimation, json_mode.estimation, other_band.estimation}) == 3
    for _ in range(20):
        corrections.learn(plain.estimation, raw_input=100, actual_input=150)
    assert corrections.input_factor(json_mode.estimation) == 1.0
    assert corrections.input_factor(other_band.estimation) == 1.0


def test_it_groups_requests_of_one_template_into_a_prompt_family():
    a = {
        "messages": [
            {"role": "system", "content": "You are a support bot."},
            {"role": "user", "content": "one"},
        ]
    }
    b = {
        "messages": [
            {"role": "system", "content": "You are a support bot."},
            {"role": "user", "content": "two"},
        ]
    }
    c = {
        "messages": [
            {"role": "system", "content": "You translate."},
            {"role": "user", "content": "one"},
        ]
    }
    family = lambda r: estimation_class(r, model="m", route="r", input_tokens=10).prompt_family  # noqa: E731
    assert family(a) == family(b) != family(c)


@given(st.lists(st.tuples(st.integers(1, 10**6), st.integers(1, 10**6)), max_size=200))
def test_it_never_leaves_the_factor_bounds(observations):
    corrections = Corrections()
    cls = estimation_class(body(), model="m", route="r", input_tokens=10)
    for raw, actual in observations:
        corrections.learn(cls, raw_input=raw, actual_input=actual)
        factor = corrections.input_factor(cls)
        assert MIN_FACTOR - 1e-9 <= factor <= MAX_FACTOR + 1e-9
    assert math.isfinite(corrections.input_factor(cls))


def test_an_estimate_made_once_gives_each_candidate_its_own_corrected_demand():
    corrections = Corrections()
    made = request_estimate(body("a" * 400, max_tokens=50))
    for _ in range(20):
        at_alpha = made.demand(
            model="m",
            route="alpha",
            default_output_tokens=400,
            max_output=4096,
            corrections=corrections,
        )
        corrections.learn(at_alpha.estimation, raw_input=made.input_tokens, actual_input=200)
    beta = made.demand(
        model="m",
        route="beta",
        default_output_tokens=400,
        max_output=4096,
        corrections=corrections,
    )
    assert at_alpha.input_tokens > beta.input_tokens == made.input_tokens
    assert at_alpha.output_tokens == beta.output_tokens == 50


def test_a_request_that_makes_no_output_reserves_none():
    embed = request_estimate(body("a" * 40))
    no_output = type(embed)(
        input_tokens=embed.input_tokens, max_output=0, prompt_family="", structured_output="none"
    )
    demand = no_output.demand(
        model="m",
        route="alpha",
        default_output_tokens=400,
        max_output=4096,
        corrections=Corrections(),
    )
    assert demand.output_tokens == 0 and demand.input_tokens == embed.input_tokens
