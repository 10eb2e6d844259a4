"""Routing that knows where capacity is left (issue 17 item 3, ``routing.core.capacity``): the
expected wait for capacity the broker last gave is waiting like any other in the routing cost,
an endpoint full past the request's deadline is left out, and a request whose every candidate
is full is refused before any broker call, naming the endpoint with room first."""

import random

import pytest

from routing.core import EndpointConfig, ModelConfig, Router, RoutingRequest, plan_explanation
from routing.core.capacity import CapacityView, capacity_costs, capacity_refusal

# USD per million tokens. No traffic seen yet: every estimate is the parameters' default
# (TTFT 1 s, 50 tokens/s, no cache hits, 1 % faults, 1 % 429s arriving after 0.5 s).
CHEAP = EndpointConfig("m@cheap", "cheap", "m", 1.0, 1.0, 2.0, 131072, 8192)
DEAR = EndpointConfig("m@dear", "dear", "m", 2.0, 2.0, 4.0, 131072, 8192)
# A typical request (the model's defaults): 1,000 tokens in, 400 out.
REQUEST = RoutingRequest("m", input_tokens=1000.0, max_tokens=400, deadline_s=10.0)
NOW = 1000.0

# By hand, from routing/core/cost.py's formulas:
#   price:   cheap 1000·1e-6 + 400·2e-6 = $0.0018, dear $0.0036
#   e2e time of each: 1 s + 400 / 50 tokens/s = 9 s
#   λ = min price / median time = 0.0018 / 9 = $0.0002 per second
#   attempt = price + λ·9 s + μ·1 s (μ = λ) + 0.01 · λ · (0.5 s + 2 s penalty)
#           cheap: 0.0018 + 0.0018 + 0.0002 + 0.000005 = 0.003805; dear: 0.005605
#   cost    = attempt / (1 − 0.01)
LAM = 0.0002
COST_CHEAP = 0.003805 / 0.99  # $0.0038434
COST_DEAR = 0.005605 / 0.99  # $0.0056616


def router(strategy="routing_cost"):
    # The cost guard lifted: this is about the capacity term, not the guard's bound.
    model = ModelConfig("m", (CHEAP, DEAR), max_cost_premium=10.0)
    return Router([model], default_strategy=strategy)


def costs_of(plan):
    return {e.provider: c for e, c in zip(plan.attempts, plan.costs, strict=True)}


def test_with_room_everywhere_the_routing_cost_is_the_hand_computed_one():
    r = router()
    plan = r.plan(REQUEST, NOW, random.Random(0))
    assert r.table("m", NOW).lam == pytest.approx(LAM)
    assert costs_of(plan) == pytest.approx({"cheap": COST_CHEAP, "dear": COST_DEAR})


def test_a_wait_for_capacity_costs_lambda_per_second():
    r = router()
    r.capacity.full(CHEAP.id, NOW + 5.0, NOW - 1.0)  # the broker: no room before NOW + 5 s
    plan = r.plan(REQUEST, NOW, random.Random(0))
    # 0.0038434 + 0.0002 · 5 s = $0.0048434: still below the dear endpoint's $0.0056616.
    assert costs_of(plan) == pytest.approx({"cheap": COST_CHEAP + 5 * LAM, "dear": COST_DEAR})


def test_a_long_enough_wait_makes_the_dearer_endpoint_with_room_the_cheaper_choice():
    r = router()
    r.capacity.full(CHEAP.id, NOW + 9.5, NOW)
    # 0.0038434 + 0.0002 · 9.5 s = $0.0057434 > $0.0056616: the dear one now costs less.
    firsts = {"cheap": 0, "dear": 0}
    rng = random.Random(1)
    for _ in range(400):
        plan = r.plan(REQUEST, NOW, rng)
        assert costs_of(plan)["cheap"] == pytest.approx(COST_CHEAP + 9.5 * LAM)
        firsts[plan.attempts[0].provider] += 1
    assert firsts["dear"] > firsts["cheap"]


def test_an_endpoint_full_past_the_deadline_is_left_out_of_the_plan():
    r = router()
    r.capacity.full(CHEAP.id, NOW + 12.0, NOW)  # 12 s > the 10 s deadline
    plan = r.plan(REQUEST, NOW, random.Random(0))
    assert [e.provider for e in plan.attempts] == ["dear"]
    assert (CHEAP.id, "capacity_wait") in plan.refused
    assert plan.capacity_refused is None


def test_a_request_whose_every_candidate_is_full_is_refused_naming_the_first_with_room():
    r = router()
    r.capacity.full(CHEAP.id, NOW + 30.0, NOW)
    r.capacity.full(DEAR.id, NOW + 12.5, NOW)
    plan = r.plan(REQUEST, NOW, random.Random(0))
    assert plan.attempts == ()
    assert plan.capacity_refused == (DEAR.id, pytest.approx(12.5))
    assert "capacity_wait=m@dear:12.5s" in plan_explanation(plan)
    # A request that may wait longer (a background class) is planned, soonest room first.
    patient = r.plan(
        RoutingRequest("m", input_tokens=1000.0, max_tokens=400, deadline_s=60.0),
        NOW,
        random.Random(0),
    )
    assert [e.provider for e in patient.attempts] == ["dear", "cheap"]
    assert costs_of(patient) == pytest.approx(
        {"cheap": COST_CHEAP + 30 * LAM, "dear": COST_DEAR + 12.5 * LAM}
    )


def test_a_large_request_refused_says_nothing_of_a_smaller_one():
    # The broker refused a 20,000-token prompt at cheap until NOW + 12 s (a token bucket, a
    # spend window): the 1,000-token request is not held by it, a 25,000-token one is.
    r = router()
    r.capacity.full(CHEAP.id, NOW + 12.0, NOW, size=20000.0)
    small = r.plan(REQUEST, NOW, random.Random(0))
    assert costs_of(small) == pytest.approx({"cheap": COST_CHEAP, "dear": COST_DEAR})
    large = r.plan(
        RoutingRequest("m", input_tokens=25000.0, max_tokens=400, deadline_s=10.0),
        NOW,
        random.Random(0),
    )
    assert [e.provider for e in large.attempts] == ["dear"]
    # A small one refused too: the view now holds from its size up.
    r.capacity.full(CHEAP.id, NOW + 12.0, NOW, size=800.0)
    assert [e.provider for e in r.plan(REQUEST, NOW, random.Random(0)).attempts] == ["dear"]


def test_a_grant_or_the_time_passing_ends_the_wait():
    r = router()
    r.capacity.full(CHEAP.id, NOW + 12.0, NOW)
    r.capacity.full(DEAR.id, NOW + 12.0, NOW)
    r.capacity.room(DEAR.id)  # another request was just granted there
    assert [e.provider for e in r.plan(REQUEST, NOW, random.Random(0)).attempts] == ["dear"]
    later = r.plan(REQUEST, NOW + 12.0, random.Random(0))
    assert costs_of(later) == pytest.approx({"cheap": COST_CHEAP, "dear": COST_DEAR})


def test_price_only_routing_ignores_the_view():
    # The baseline keeps today's behaviour: the same plans, full or not.
    plain, told = router("price_only"), router("price_only")
    told.capacity.full(CHEAP.id, NOW + 30.0, NOW)
    told.capacity.full(DEAR.id, NOW + 30.0, NOW)
    for seed in range(50):
        a = plain.plan(REQUEST, NOW, random.Random(seed))
        b = told.plan(REQUEST, NOW, random.Random(seed))
        assert a.attempts == b.attempts and a.capacity_refused is b.capacity_refused is None


def test_the_view_and_the_formulas_by_themselves():
    view = CapacityView()
    view.full("a", 105.0, 100.0, size=500.0)
    view.full("b", 99.0, 100.0)  # a fit time already past: room now
    assert view.wait("a", 101.0, 500.0) == pytest.approx(4.0)
    assert view.wait("a", 101.0, 499.0) == 0.0
    assert view.wait("b", 101.0) == 0.0 and view.wait("c", 101.0) == 0.0
    assert view.wait("a", 106.0) == 0.0 and "a" not in view.free_at
    assert capacity_costs([0.002, 0.003], [0.0, 4.0], 0.0005) == pytest.approx([0.002, 0.005])
    assert capacity_refusal(["a", "b", "c"], [3.0, 11.0, 0.0], 10.0) == ([0, 2], None)
    assert capacity_refusal(["a", "b"], [14.0, 11.0], 10.0) == ([], ("b", 11.0))
