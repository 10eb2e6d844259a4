"""Shadow prices of scarce shared capacity (issue 17, ``routing.core.scarcity``): a request that
would take much of a pool the broker keeps refusing costs the requests it displaces there, and
where it displaces more than one it is left out of the plan; a small one still goes."""

import random

import pytest

from routing.core import EndpointConfig, ModelConfig, Router, RoutingRequest, plan_explanation
from routing.core.scarcity import HALF_LIFE_S, ScarcityView, ask, scarcity_costs

# USD per million tokens. No traffic seen yet: every estimate is the parameters' default
# (TTFT 1 s, 50 tokens/s, no cache hits, 1 % faults, 1 % 429s arriving after 0.5 s).
CHEAP = EndpointConfig("m@cheap", "cheap", "m", 1.0, 1.0, 2.0, 131072, 8192)
DEAR = EndpointConfig("m@dear", "dear", "m", 2.0, 2.0, 4.0, 131072, 8192)
TYPICAL = RoutingRequest("m", input_tokens=1000.0, max_tokens=400)
SMALL = RoutingRequest("m", input_tokens=200.0, max_tokens=100)
NOW = 1000.0
SPEND = ("cheap-spend", "spend")
SLOTS = ("cheap-slots", "concurrency")

# By hand, from routing/core/cost.py's formulas (λ = $0.0002/s: the model's typical request,
# 1,000 in and 400 out, costs $0.0018 at cheap and takes 9 s everywhere):
#   SMALL (200 in, 100 out): price cheap 200·1e-6 + 100·2e-6 = $0.0004, dear $0.0008;
#   time 1 s + 100/50 = 3 s; attempt = price + λ·3 s + μ·1 s + 0.01·λ·2.5 s
#     cheap 0.0004 + 0.0006 + 0.0002 + 0.000005 = 0.001205, dear 0.001605; cost = / 0.99
#   TYPICAL: price cheap $0.0018, time 9 s (the capacity test's $0.0038434 and $0.0056616)
SMALL_CHEAP = 0.001205 / 0.99  # $0.00121717
SMALL_DEAR = 0.001605 / 0.99  # $0.00162121
TYPICAL_DEAR = 0.005605 / 0.99

# The broker refused 60 small requests at cheap's pool and then granted 30 tries, all at NOW:
#   ρ = 60 / (90 tries + 20 prior) = 6/11
RHO = 6 / 11


def router(strategy="routing_cost"):
    # The cost guard lifted: this is about the shadow price, not the guard's bound.
    return Router(
        [ModelConfig("m", (CHEAP, DEAR), max_cost_premium=10.0)], default_strategy=strategy
    )


def refuse(r, buckets, times, at=NOW, request=SMALL):
    for _ in range(times):
        r.scarcity_refused(
            CHEAP.id,
            "provider:cheap",
            at,
            buckets,
            input_tokens=request.input_tokens,
            output_tokens=float(request.max_tokens),
        )


def grant(r, times, at=NOW):
    for _ in range(times):
        r.scarcity_granted(CHEAP.id, "provider:cheap", at)


def costs_of(plan):
    return {e.provider: c for e, c in zip(plan.attempts, plan.costs, strict=True)}


def displaced(r, request, endpoint=CHEAP, at=NOW):
    # What the planner asks the view for cheap's candidate, priced by hand above.
    price = {200.0: 0.0004, 1000.0: 0.0018}[request.input_tokens]
    seconds = 1.0 + request.max_tokens / 50.0
    return r.scarcity.displaced(
        endpoint.id,
        at,
        input_tokens=request.input_tokens,
        output_tokens=float(request.max_tokens),
        price=price,
        seconds=seconds,
    )


def test_it_asks_of_each_dimension_what_the_request_would_take():
    figures = {"input_tokens": 200.0, "output_tokens": 100.0, "price": 0.0004, "seconds": 3.0}
    assert ask("requests", **figures) == 1.0
    assert ask("input_tokens", **figures) == 200.0
    assert ask("output_tokens", **figures) == 100.0
    assert ask("total_tokens", **figures) == 300.0
    assert ask("spend", **figures) == 0.0004
    assert ask("concurrency", **figures) == 3.0  # slot-seconds: a slot held for the answer


def test_it_knows_nothing_of_a_pool_before_its_first_refusal():
    r = router()
    grant(r, 50)
    assert not r.scarcity.active
    plan = r.plan(SMALL, NOW, random.Random(0))
    assert costs_of(plan) == pytest.approx({"cheap": SMALL_CHEAP, "dear": SMALL_DEAR})


def test_a_request_like_those_refused_displaces_rho_of_one():
    r = router()
    refuse(r, [SPEND], 60)
    grant(r, 30)
    # u/ū = $0.0004 / $0.0004 = 1: d = ρ = 6/11
    assert displaced(r, SMALL) == pytest.approx(RHO)
    assert displaced(r, SMALL, endpoint=DEAR) == 0.0  # dear's pool never refused


def test_the_shadow_price_makes_the_dearer_endpoint_with_spare_capacity_the_cheaper():
    r = router()
    refuse(r, [SPEND], 60)
    grant(r, 30)
    plan = r.plan(SMALL, NOW, random.Random(0))
    # cheap: 0.00121717 + 6/11 · 0.00121717 (the least cost) = $0.00188108 > dear's $0.00162121
    assert costs_of(plan) == pytest.approx({"cheap": 0.00188108, "dear": SMALL_DEAR}, rel=1e-5)
    firsts = {"cheap": 0, "dear": 0}
    rng = random.Random(1)
    for _ in range(400):
        firsts[r.plan(SMALL, NOW, rng).attempts[0].provider] += 1
    assert firsts["dear"] > firsts["cheap"]


def test_a_request_that_would_displace_more_than_one_is_left_out_of_that_pool():
    r = router()
    refuse(r, [SPEND], 60)
    grant(r, 30)
    # The typical request's $0.0018 is 4.5 small ones' spend: d = 6/11 · 4.5 = 27/11 > 1.
    assert displaced(r, TYPICAL) == pytest.approx(27 / 11)
    plan = r.plan(TYPICAL, NOW, random.Random(0))
    assert [e.provider for e in plan.attempts] == ["dear"]
    assert costs_of(plan) == pytest.approx({"dear": TYPICAL_DEAR})
    assert (CHEAP.id, "scarce") in plan.refused
    assert "m@cheap:scarce" in plan_explanation(plan)
    # The small request, d = 6/11 < 1, is still planned there.
    assert {e.provider for e in r.plan(SMALL, NOW, random.Random(0)).attempts} == {
        "cheap",
        "dear",
    }


def test_a_slot_is_priced_in_the_seconds_an_answer_holds_it():
    r = router()
    refuse(r, [SLOTS], 60)
    grant(r, 30)
    # Refused requests held a slot 1 + 100/50 = 3 s; the typical one would hold it 9 s: d = 3ρ.
    assert displaced(r, TYPICAL) == pytest.approx(3 * RHO)


def test_each_bucket_weighs_by_how_often_it_is_the_one_that_refused():
    r = router()
    refuse(r, [SPEND], 30)
    refuse(r, [SLOTS], 30)
    refuse(r, [], 40)  # refused while others waited in the queue: no bucket named
    grant(r, 10)
    # ρ = 100 / (110 + 20) = 10/13; s = ½ each; d = 10/13 · (½ · 4.5 + ½ · 3) = 10/13 · 3.75
    assert displaced(r, TYPICAL) == pytest.approx(10 / 13 * 3.75)


def test_refusals_fade_with_a_half_life():
    r = router()
    refuse(r, [SPEND], 60)
    grant(r, 30)
    later = NOW + HALF_LIFE_S
    # Halved sums, the same prior: ρ = 30 / (45 + 20) = 6/13
    assert displaced(r, SMALL, at=later) == pytest.approx(6 / 13)
    # and as they fade, the typical request comes back: d = 4.5 · ρ ≤ 1 once ρ ≤ 2/9
    assert displaced(r, TYPICAL, at=NOW + 10 * HALF_LIFE_S) < 1.0
    plan = r.plan(TYPICAL, NOW + 10 * HALF_LIFE_S, random.Random(0))
    assert {e.provider for e in plan.attempts} == {"cheap", "dear"}


def test_when_every_candidate_displaces_more_than_one_the_least_stays():
    assert scarcity_costs([1.0, 2.0], [3.0, 1.5]) == ([4.0, 3.5], [1])
    assert scarcity_costs([1.0, 2.0], [0.5, 0.0]) == ([1.5, 2.0], [0, 1])


def test_the_price_only_baseline_ignores_it():
    r = router("price_only")
    refuse(r, [SPEND], 60)
    grant(r, 30)
    plan = r.plan(TYPICAL, NOW, random.Random(0))
    assert {e.provider for e in plan.attempts} == {"cheap", "dear"}
    assert not any(why == "scarce" for _, why in plan.refused)


def test_the_view_is_per_pool_and_shared_by_the_endpoints_in_it():
    view = ScarcityView()
    view.refused("a@gamma", "provider:gamma", NOW, [("gamma-spend", "spend", 0.0004)])
    view.granted("b@gamma", "provider:gamma", NOW)  # another model's endpoint, same pool
    figures = {"input_tokens": 1.0, "output_tokens": 1.0, "price": 0.0008, "seconds": 1.0}
    # ρ = 1 / (2 + 20); u/ū = 2
    assert view.displaced("b@gamma", NOW, **figures) == pytest.approx(2 / 22)
    assert view.displaced("c@alpha", NOW, **figures) == 0.0
