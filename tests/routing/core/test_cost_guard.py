"""The cost guard (issue 17): the routing-cost shares' expected price premium over the cheapest
eligible endpoint stays under the model's (or the request's) ``max_cost_premium``."""

import math
import random
from collections import Counter

import pytest

from routing.core import (
    EndpointConfig,
    ModelConfig,
    Outcome,
    Router,
    RoutingRequest,
    plan_explanation,
    provider_preferences_parse,
)
from routing.core.guards import cost_guard, price_premium

FLOOR = [0.01, 0.01, 0.01]
OPEN = [1.0, 1.0, 1.0]


def test_it_moves_the_least_share_from_the_dearest_to_the_cheapest():
    # Effective prices per good answer $1.0 / $1.2 / $2.0; the band gave 20 / 30 / 50 %.
    prices, shares = [1.0, 1.2, 2.0], [0.2, 0.3, 0.5]
    # By hand: 0.2·1 + 0.3·1.2 + 0.5·2 = $1.56, +56 % over the cheapest. At +6 % the mix may
    # cost $1.06: $0.50 to save. The dearest gives all but its floor to the cheapest (0.49 of
    # share at $1.00 saved each: $0.49), then the middle one gives 0.05 ($0.20 each: $0.01).
    out, before, after = cost_guard(shares, prices, FLOOR, OPEN, 0.06)

    assert before == pytest.approx(0.56)
    assert out == pytest.approx([0.74, 0.25, 0.01])
    assert after == pytest.approx(0.06)
    assert sum(out) == pytest.approx(1.0)
    assert price_premium(out, prices, 1.0) == pytest.approx(0.06)


def test_it_keeps_caps_and_floors_even_when_the_bound_is_out_of_reach():
    # The cheapest can take at most half the traffic: the rest goes to the next cheapest.
    prices, shares = [1.0, 1.2, 2.0], [0.2, 0.3, 0.5]
    out, before, after = cost_guard(shares, prices, FLOOR, [0.5, 1.0, 1.0], 0.06)
    # By hand: 0.3 to the cheapest (its cap) saves $0.30; the dearest's other 0.19 go to the
    # middle one at $0.80 each ($0.152); then nothing dearer than a taker is left.
    assert out == pytest.approx([0.5, 0.49, 0.01])
    assert after == pytest.approx(0.5 + 0.49 * 1.2 + 0.01 * 2.0 - 1.0)  # +10.8 %
    assert before == pytest.approx(0.56) and after > 0.06


def test_it_leaves_shares_alone_when_the_premium_is_already_under_the_bound():
    prices, shares = [1.0, 1.2, 2.0], [0.9, 0.08, 0.02]
    out, before, after = cost_guard(shares, prices, FLOOR, OPEN, 0.06)
    assert out is shares
    assert before == after == pytest.approx(0.9 + 0.096 + 0.04 - 1.0)  # +3.6 %


def test_it_measures_the_premium_over_the_cheapest_eligible_endpoint():
    # The cheapest is behind its breaker (probe share: floor = cap): it is no yardstick.
    prices, shares = [0.5, 1.0, 2.0], [0.002, 0.5, 0.498]
    out, before, after = cost_guard(shares, prices, [0.002, 0.01, 0.01], [0.002, 1.0, 1.0], 0.1)
    assert before == pytest.approx(0.001 + 0.5 + 0.996 - 1.0)
    assert out[0] == 0.002
    assert after == pytest.approx(0.1)


# --- in the planner -----------------------------------------------------------------------

CHEAP = EndpointConfig("m@cheap", "cheap", "m", 1.0, 1.0, 2.0, 131072, 8192)
MID = EndpointConfig("m@mid", "mid", "m", 1.2, 1.2, 2.4, 131072, 8192)
FAST = EndpointConfig("m@fast", "fast", "m", 2.0, 2.0, 4.0, 131072, 8192)
SPEED = {"cheap": (1.2, 30.0), "mid": (0.8, 50.0), "fast": (0.3, 150.0)}
NOW = 300.0


def router(max_cost_premium: float = 0.06) -> Router:
    r = Router([ModelConfig("m", (CHEAP, MID, FAST), max_cost_premium=max_cost_premium)])
    for k in range(600):
        for e in (CHEAP, MID, FAST):
            ttft, tps = SPEED[e.provider]
            done = Outcome(
                "ok",
                latency_s=ttft + 300 / tps,
                ttft_s=ttft,
                input_tokens=3000,
                output_tokens=300,
            )
            r.observe(e.id, done, k * 0.5)
    return r


def first_choices(r: Router, prefs: dict | None = None, n: int = 4000) -> dict[str, float]:
    request = RoutingRequest("m", provider=provider_preferences_parse(prefs))
    seen = Counter(r.plan(request, NOW, random.Random(s)).attempts[0].provider for s in range(n))
    return {p: seen[p] / n for p in ("cheap", "mid", "fast")}


def test_the_planner_bounds_the_shares_the_router_would_choose():
    # Prices of a typical request (3000 in, 300 out, no cache, no failures) stand 1 : 1.2 : 2,
    # as in the first test. Unbound, speed takes most of the traffic to the dearer two.
    unbound = first_choices(router(max_cost_premium=10.0))
    assert unbound["cheap"] < 0.2
    premium = unbound["mid"] * 0.2 + unbound["fast"] * 1.0
    assert premium > 0.3

    bound = first_choices(router())
    # By hand, as in the first test: fast at its floor; x + y = 0.99, x + 1.2·y + 0.02 = 1.06.
    assert bound["fast"] == pytest.approx(0.01, abs=0.006)
    assert bound["mid"] == pytest.approx(0.25, abs=0.025)
    assert bound["cheap"] == pytest.approx(0.74, abs=0.025)

    plan = router().plan(RoutingRequest("m"), NOW, random.Random(1))
    before, after = plan.cost_guard
    assert before == pytest.approx(premium, abs=0.05) and after == pytest.approx(0.06)
    assert f"cost_guard=bound({before:+.1%}->+6.0%)" in plan_explanation(plan)


def test_a_request_states_its_own_bound():
    r = router()  # the model's bound: +6 %
    loose = first_choices(r, {"max_cost_premium": 10})
    assert loose["cheap"] < 0.2  # the guard does not bind: the router's own shares
    plan = r.plan(
        RoutingRequest("m", provider=provider_preferences_parse({"max_cost_premium": 10})),
        NOW,
        random.Random(1),
    )
    assert plan.cost_guard is None and "cost_guard" not in plan_explanation(plan)

    tight = first_choices(r, {"max_cost_premium": 0})
    # Only the floors stay on the dearer two: 0.98 on the cheapest.
    assert tight["cheap"] == pytest.approx(0.98, abs=0.01)


def test_it_does_not_bound_an_explicit_sort():
    plan = router(max_cost_premium=0.0).plan(
        RoutingRequest("m", provider=provider_preferences_parse({"sort": "throughput"})),
        NOW,
        random.Random(1),
    )
    assert plan.attempts[0].provider == "fast" and plan.cost_guard is None


@pytest.mark.parametrize("bad", [-0.01, "6%", True, [0.06], math.inf, math.nan])
def test_it_refuses_a_bound_that_is_not_a_non_negative_number(bad):
    with pytest.raises(ValueError, match=r"provider\.max_cost_premium must be a non-negative"):
        provider_preferences_parse({"max_cost_premium": bad})


def test_it_takes_a_null_bound_as_the_models():
    assert provider_preferences_parse({"max_cost_premium": None}).max_cost_premium is None
    assert provider_preferences_parse({"max_cost_premium": 0}).max_cost_premium == 0.0


# --- the reference: the cheapest eligible endpoint that can take more traffic ---------------


def test_it_measures_against_and_moves_share_to_the_cheapest_endpoint_with_room():
    # The cheapest is full (its learned cap reached, or the broker refusing it): it keeps its
    # 20 % but takes no more, and the bound is over the cheapest that can take more, mid.
    prices, shares = [1.0, 1.2, 2.0], [0.2, 0.3, 0.5]
    out, before, after = cost_guard(shares, prices, FLOOR, OPEN, 0.06, [True, False, False])
    # By hand: the mix costs $1.56, +30 % over mid's $1.20; at +6 % it may cost $1.272:
    # $0.288 to save, at $0.80 a unit of share moved from fast to mid: 0.36 of share.
    assert before == pytest.approx(0.3)
    assert out == pytest.approx([0.2, 0.66, 0.14])
    assert after == pytest.approx(0.06)
    assert price_premium(out, prices, 1.2) == pytest.approx(0.06)


def test_a_full_endpoint_still_gives_share_up_but_is_no_yardstick():
    # The dearest is full: it is no taker, but a donor like any other.
    prices, shares = [1.0, 1.2, 2.0], [0.2, 0.3, 0.5]
    assert cost_guard(shares, prices, FLOOR, OPEN, 0.06, [False, False, True])[0] == (
        pytest.approx([0.74, 0.25, 0.01])
    )


def test_it_binds_nothing_when_every_eligible_endpoint_is_full():
    prices, shares = [1.0, 1.2, 2.0], [0.2, 0.3, 0.5]
    out, before, after = cost_guard(shares, prices, FLOOR, OPEN, 0.0, [True, True, True])
    assert out is shares and before == after


def premium_over(choices: dict[str, float], reference: float) -> float:
    price = {"cheap": 1.0, "mid": 1.2, "fast": 2.0}
    return sum(share * price[p] for p, share in choices.items()) / reference - 1.0


def test_the_planner_takes_an_endpoint_the_broker_keeps_refusing_for_full():
    r = router()
    unbound = first_choices(router(max_cost_premium=10.0))
    # The broker refused the last 5 fast tries at cheap (others waited in its queue; a
    # concurrency limit is the same): ρ = 5 / (5 + 20 prior tries) = 20 %, over the 10 % at
    # which 429s cut a learned cap.
    for _ in range(5):
        r.scarcity_refused("m@cheap", "provider:cheap", NOW, (), input_tokens=3000,
                           output_tokens=300)  # fmt: skip
    assert r.scarcity.refused_share("m@cheap", NOW) == pytest.approx(0.2)
    bound = first_choices(r)
    # No share moved to cheap (the band's own, as unbound) and the mix within +6 % of mid's
    # price, not cheap's.
    assert bound["cheap"] == pytest.approx(unbound["cheap"], abs=0.025)
    assert premium_over(bound, 1.2) == pytest.approx(0.06, abs=0.03)
    plan = r.plan(RoutingRequest("m"), NOW, random.Random(1))
    assert plan.cost_guard is not None and plan.cost_guard[1] == pytest.approx(0.06)


def test_the_planner_takes_an_endpoint_at_its_learned_cap_for_full():
    r = router()
    # 2 attempts/s at each endpoint (600 in 300 s); a cap of 2/s: cheap runs at its cap.
    r.stats["m@cheap"]["cap"], r.stats["m@cheap"]["capt"] = 2.0, NOW
    plan = r.plan(RoutingRequest("m"), NOW, random.Random(1))
    assert plan.cost_guard is not None and plan.cost_guard[1] == pytest.approx(0.06)
    bound = first_choices(r)
    assert premium_over(bound, 1.2) == pytest.approx(0.06, abs=0.03)


def test_the_planner_takes_an_endpoint_the_broker_said_has_no_room_yet_for_full():
    r = router()
    r.capacity.full("m@cheap", NOW + 5.0, NOW, 0.0)  # room again in 5 s
    plan = r.plan(RoutingRequest("m"), NOW, random.Random(1))
    assert plan.cost_guard is not None and plan.cost_guard[1] == pytest.approx(0.06)
    assert premium_over(first_choices(r), 1.2) == pytest.approx(0.06, abs=0.03)


def test_share_the_guard_moves_to_a_cap_is_not_demand_the_cap_held_back():
    # cheap's cap, 3 attempts/s of the model's 6, bounds its share at 0.5: the band gives it
    # less than 0.2, the guard fills it to the bound (it wants 0.74). That is the user's bound
    # at work, not the router's demand: the cap must not grow on it (G10), or it outgrows what
    # the endpoint serves (market (b): 1.5 -> 5 attempts/s, gamma serving 1).
    r = router()
    r.stats["m@cheap"]["cap"], r.stats["m@cheap"]["capt"] = 3.0, NOW
    plan = r.plan(RoutingRequest("m"), NOW, random.Random(1))
    assert plan.cost_guard is not None and plan.capped == ()
    assert "bcp" not in r.stats["m@cheap"]
    assert first_choices(r)["cheap"] == pytest.approx(0.5, abs=0.025)
