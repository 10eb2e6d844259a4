"""The default guards (issue 17): with no ``max_cost_premium`` stated on the model or the
request, the router's traffic mix is expected no slower than the price-only router's, and no
dearer than +6 % over the cheapest endpoint with room or than price-only's, whichever is more.
A stated bound is kept as stated (tests/routing/core/test_cost_guard.py)."""

import random
from collections import Counter

import pytest

from routing.core import (
    EndpointConfig,
    ModelConfig,
    Outcome,
    Router,
    RoutingRequest,
    StickyState,
    plan_explanation,
    provider_preferences_parse,
)
from routing.core.guards import cost_guard, mix_mean, speed_guard
from routing.core.legacy import price_only_shares
from routing.core.parameters import RoutingParameters

FLOOR = [0.01, 0.01, 0.01]
OPEN = [1.0, 1.0, 1.0]


PRICE_ONLY_SHARES = [0.5, 0.3, 0.2]
EXACT = [0.0, 0.0, 0.0]  # estimates without noise


def test_the_speed_guard_moves_the_least_share_from_the_slowest_to_the_fastest():
    # Waits 3 / 2 / 1 s; the band gave 70 / 20 / 10 %, price-only 50 / 30 / 20 %.
    waits, shares = [3.0, 2.0, 1.0], [0.7, 0.2, 0.1]
    # By hand: price-only waits 1.5 + 0.6 + 0.2 = 2.3 s, the band 2.1 + 0.4 + 0.1 = 2.6 s:
    # 0.3 s to save, 2 s a unit of share moved from the slowest to the fastest: 0.15.
    out, moved = speed_guard(shares, waits, FLOOR, OPEN, PRICE_ONLY_SHARES, EXACT, 2.0)
    assert moved and out == pytest.approx([0.55, 0.2, 0.25])
    assert mix_mean(out, waits) == pytest.approx(2.3)


def test_the_speed_guard_leaves_a_mix_as_fast_as_price_only_alone():
    waits, shares = [3.0, 2.0, 1.0], [0.4, 0.3, 0.3]
    out, moved = speed_guard(shares, waits, FLOOR, OPEN, PRICE_ONLY_SHARES, EXACT, 2.0)
    assert out is shares and not moved


def test_the_speed_guard_leaves_a_gap_within_the_estimates_noise_alone():
    # The same 0.3 s gap. By hand, with every wait known to ±25 % (one standard error):
    # the gap's terms (x − s)·w are 0.6, −0.2, −0.1 s, its standard error
    # √((0.6² + 0.2² + 0.1²)·0.25²) = 0.160 s; two of them, 0.320 s, exceed 0.3 s: noise.
    waits, shares = [3.0, 2.0, 1.0], [0.7, 0.2, 0.1]
    out, moved = speed_guard(shares, waits, FLOOR, OPEN, PRICE_ONLY_SHARES, [0.25] * 3, 2.0)
    assert out is shares and not moved
    # Known to ±10 %: 0.128 s, so the gap is real, and it is closed whole, not to the noise.
    out, moved = speed_guard(shares, waits, FLOOR, OPEN, PRICE_ONLY_SHARES, [0.1] * 3, 2.0)
    assert moved and out == pytest.approx([0.55, 0.2, 0.25])


def test_the_speed_guard_moves_no_share_to_a_full_endpoint():
    # The fastest is full: the share goes to the next fastest, 1 s a unit: 0.3 of share.
    waits, shares = [3.0, 2.0, 1.0], [0.7, 0.2, 0.1]
    full = [False, False, True]
    out, moved = speed_guard(shares, waits, FLOOR, OPEN, PRICE_ONLY_SHARES, EXACT, 2.0, full)
    assert moved and out == pytest.approx([0.4, 0.5, 0.1])


def test_the_cost_guard_allows_what_price_only_would_pay_when_that_is_more():
    # Prices $1.0 / $1.2 / $2.0; price-only would pay $1.20 a request, +20 % over the cheapest.
    prices, shares = [1.0, 1.2, 2.0], [0.2, 0.3, 0.5]
    # By hand: the band's mix costs $1.56 (+56 %); the bound is max(1.06, 1.20) = $1.20:
    # $0.36 to save at $1.00 a unit from the dearest to the cheapest: 0.36 of share.
    out, before, after = cost_guard(shares, prices, FLOOR, OPEN, 0.06, baseline=1.2)
    assert before == pytest.approx(0.56)
    assert out == pytest.approx([0.56, 0.3, 0.14])
    assert after == pytest.approx(0.2)
    # Where price-only pays less than the premium allows, the premium is the bound.
    assert cost_guard(shares, prices, FLOOR, OPEN, 0.06, baseline=1.03)[2] == pytest.approx(0.06)


# --- in the planner -----------------------------------------------------------------------

CHEAP = EndpointConfig("m@cheap", "cheap", "m", 1.0, 1.0, 2.0, 131072, 8192)
MID = EndpointConfig("m@mid", "mid", "m", 1.2, 1.2, 2.4, 131072, 8192)
FAST = EndpointConfig("m@fast", "fast", "m", 2.0, 2.0, 4.0, 131072, 8192)
NOW = 300.0


def router(
    speed: dict[str, tuple[float, float]],
    premium: float | None = None,
    params: RoutingParameters | None = None,
) -> Router:
    model = ModelConfig(
        "m", (CHEAP, MID, FAST), params=params or RoutingParameters(), max_cost_premium=premium
    )
    r = Router([model])
    for k in range(600):
        for e in (CHEAP, MID, FAST):
            ttft, tps = speed[e.provider]
            done = Outcome(
                "ok", latency_s=ttft + 300 / tps, ttft_s=ttft, input_tokens=3000, output_tokens=300
            )
            r.observe(e.id, done, k * 0.5)
    return r


def first_choices(r: Router, prefs: dict | None = None, n: int = 4000) -> dict[str, float]:
    request = RoutingRequest("m", provider=provider_preferences_parse(prefs))
    seen = Counter(r.plan(request, NOW, random.Random(s)).attempts[0].provider for s in range(n))
    return {p: seen[p] / n for p in ("cheap", "mid", "fast")}


def expected(choices: dict[str, float], per: dict[str, float]) -> float:
    return sum(share * per[p] for p, share in choices.items())


# Price-only's shares by the listed input price 1 : 1.2 : 2 (1/p²): 51.4 / 35.7 / 12.9 %.
PRICE_ONLY = dict(
    zip(("cheap", "mid", "fast"), price_only_shares([1.0, 1.2, 2.0], [False] * 3), strict=True)
)
PRICE = {"cheap": 1.0, "mid": 1.2, "fast": 2.0}  # a typical request's price, in units of cheap's


def test_by_default_the_router_is_no_slower_than_price_only_and_no_dearer():
    # Nearly as fast for a third of the price: λ (anchored on the cheapest price) says the
    # fast endpoint is not worth 2×, so the band puts most traffic on cheap, slower than the
    # mix price-only buys with its listed-price lottery.
    speed = {"cheap": (0.40, 95.0), "mid": (0.38, 100.0), "fast": (0.30, 120.0)}
    wait = {p: 2 * ttft + 300 / tps for p, (ttft, tps) in speed.items()}  # ttft_weight 1
    ttft = {p: first_token for p, (first_token, _) in speed.items()}
    stated = first_choices(router(speed, premium=0.06))
    assert expected(stated, wait) > expected(PRICE_ONLY, wait) + 0.05
    chosen = first_choices(router(speed))
    # No slower than price-only's mix (sampling error of 4,000 draws aside) and no dearer.
    assert expected(chosen, wait) <= expected(PRICE_ONLY, wait) + 0.01
    assert expected(chosen, ttft) <= expected(PRICE_ONLY, ttft) + 0.002
    assert expected(chosen, PRICE) <= expected(PRICE_ONLY, PRICE) + 0.01
    plan = router(speed).plan(RoutingRequest("m"), NOW, random.Random(1))
    assert plan.speed_guard and "speed_guard=price_only" in plan_explanation(plan)


def test_with_a_noise_allowance_the_router_keeps_its_savings_between_endpoints_as_fast():
    # cheap answers 2.5 % slower, within two standard errors of what 430-odd answers say
    # (±2.5 % each). By default the speed guard closes that gap: share moves to mid until the
    # mix is as fast as price-only's (53 % to cheap, $1.10 a request). With speed_guard_z = 2
    # it does not chase it: the band's own shares stand (about 68 % to cheap, $1.07).
    speed = {"cheap": (0.41, 95.0), "mid": (0.40, 95.0), "fast": (0.40, 95.0)}
    ttft = {p: first_token for p, (first_token, _) in speed.items()}
    assert expected(PRICE_ONLY, ttft) < ttft["cheap"]
    assert router(speed).plan(RoutingRequest("m"), NOW, random.Random(1)).speed_guard
    assert first_choices(router(speed))["cheap"] < 0.57
    allowing = RoutingParameters(speed_guard_z=2.0)
    plan = router(speed, params=allowing).plan(RoutingRequest("m"), NOW, random.Random(1))
    assert not plan.speed_guard
    chosen = first_choices(router(speed, params=allowing))
    assert chosen["cheap"] > 0.64 and expected(chosen, PRICE) < 1.085


def test_a_stated_bound_turns_the_default_guards_off():
    speed = {"cheap": (0.40, 95.0), "mid": (0.38, 100.0), "fast": (0.30, 120.0)}
    r = router(speed)
    tight = first_choices(r, {"max_cost_premium": 0})
    assert tight["cheap"] == pytest.approx(0.98, abs=0.01)  # floors only on the dearer two
    plan = r.plan(
        RoutingRequest("m", provider=provider_preferences_parse({"max_cost_premium": 0})),
        NOW,
        random.Random(1),
    )
    assert not plan.speed_guard and "speed_guard" not in plan_explanation(plan)


def test_under_the_default_guards_a_conversation_stays_while_warm():
    # fast's routing cost is well above the best, more than the cache saves: a conversation
    # pinned there leaves at once under a stated bound, and stays under the default guards
    # (G12's plain rule, as price-only's; a cost-gap move skews the mix served toward the
    # cheapest, away from the guarded shares).
    speed = {"cheap": (0.40, 95.0), "mid": (0.38, 100.0), "fast": (0.30, 120.0)}
    pinned = StickyState("m@fast", last_used=NOW - 1.0, prefix_tokens=100)
    request = RoutingRequest("m", sticky=pinned)
    stated = router(speed, premium=0.06).plan(request, NOW, random.Random(1))
    assert not stated.sticky and stated.sticky_reason == "cost_gap"
    default = router(speed).plan(request, NOW, random.Random(1))
    assert default.sticky and default.sticky_reason == "warm"
    assert default.attempts[0].provider == "fast"
