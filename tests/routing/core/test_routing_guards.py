"""Guards (SPEC G7, G8, G10, G11): breaker, quality flag, backoff, learned cap, floor."""

import math
import random
from collections import Counter

from routing.core import EndpointConfig, ModelConfig, Outcome, Router, RoutingRequest
from routing.core.guards import backoff_multiplier
from routing.core.parameters import RoutingParameters
from routing.core.stats import attempt_rate, endpoint_capped, endpoint_observe

P = RoutingParameters()


def endpoint(name, price=0.5, supports=("tools",)):
    return EndpointConfig(
        f"m@{name}", name, "m", price, price / 10, price * 3, 131072, 8192, frozenset(supports)
    )


A, B, C = endpoint("a"), endpoint("b"), endpoint("c")
GOOD = Outcome("ok", latency_s=4.0, ttft_s=0.5, input_tokens=2000, output_tokens=300)


PLAIN = RoutingRequest("m")


def checked_answer(*, bad: bool) -> Outcome:
    """A good answer whose tool call was validated: well-formed or (``bad``) malformed."""
    return Outcome(
        "ok",
        latency_s=4.0,
        ttft_s=0.5,
        input_tokens=2000,
        output_tokens=300,
        output_checked=True,
        output_bad=bad,
    )


def drive(router, behaviour, start, end, rate, rng, request=PLAIN):
    """Send Poisson traffic from start to end; behaviour(endpoint, t) → Outcome. Returns firsts."""
    t, firsts = start, Counter()
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return firsts
        plan = router.plan(request, t, rng)
        firsts[plan.attempts[0].provider] += 1
        for e in plan.attempts[:3]:
            outcome = behaviour(e, t)
            router.observe(e.id, outcome, t)
            if outcome.kind == "ok":
                break


def test_it_backs_off_after_failures_and_recovers_with_time():
    state: dict[str, float] = {}
    for k in range(10):
        endpoint_observe(state, GOOD, k * 0.1, P)
    for k in range(10):
        endpoint_observe(state, Outcome("rate_limited", latency_s=0.2), 1 + k * 0.1, P)
    recent = state["bf"] / state["bn"]
    hit = backoff_multiplier(recent, 0.02, P)
    assert hit < 0.2
    # No traffic for a while: the short window empties and the prior brings it back to 1.
    multipliers = []
    for dt in (5.0, 10.0, 30.0, 60.0):
        d = 2 ** (-dt / P.backoff_half_life_s)
        r = (state["bf"] * d + P.prior_backoff * 0.02) / (state["bn"] * d + P.prior_backoff)
        multipliers.append(backoff_multiplier(r, 0.02, P))
    assert hit < multipliers[0] < multipliers[1] < multipliers[2] <= multipliers[3] == 1.0


def test_it_ignores_a_chronic_small_error_rate_in_backoff():
    assert backoff_multiplier(0.03, 0.02, P) == 1.0


def test_it_moves_traffic_away_from_an_incident_within_seconds_and_back_after():
    router = Router([ModelConfig("m", (A, B, C))])
    rng = random.Random(3)
    incident = (100.0, 160.0)

    def behaviour(e, t):
        if e is A and incident[0] <= t < incident[1] and rng.random() < 0.5:
            return Outcome("fault", latency_s=0.3)
        return GOOD

    before = drive(router, behaviour, 0, 100, 5.0, rng)
    assert before["a"] > 100  # a third of the traffic, roughly
    drive(router, behaviour, 100, 110, 5.0, rng)
    during = drive(router, behaviour, 110, 160, 5.0, rng)
    # Breaker open: probes, and a retry whenever the decayed fault rate dips to the threshold.
    assert during["a"] / sum(during.values()) < 0.03
    table = router.table("m", 159.0)
    assert table is not None and table.demoted[0] == "breaker"
    drive(router, behaviour, 160, 300, 5.0, rng)
    after = drive(router, behaviour, 300, 400, 5.0, rng)
    assert after["a"] > 100


def test_it_learns_a_cap_sends_the_excess_elsewhere_and_raises_it_when_capacity_grows():
    cheap, dear = endpoint("cheap", 0.3), endpoint("dear", 0.6)
    router = Router([ModelConfig("m", (cheap, dear))])
    rng = random.Random(5)
    capacity = {"cheap": 2.0}  # attempts/s the cheap one accepts (token bucket, burst 5)
    bucket = {"level": 5.0, "t": 0.0}

    def behaviour(e, t):
        if e is cheap:
            rate = capacity["cheap"]
            bucket["level"] = min(5.0, bucket["level"] + (t - bucket["t"]) * rate)
            bucket["t"] = t
            if bucket["level"] < 1.0:
                return Outcome("rate_limited", latency_s=0.1)
            bucket["level"] -= 1.0
        return GOOD

    drive(router, behaviour, 0, 60, 6.0, rng)  # the big spike: the cap is set
    state = router.stats[cheap.id]
    assert 0 < state["cap"] < 4.0
    refusals_before = state["rl"]
    firsts = drive(router, behaviour, 60, 180, 6.0, rng)  # the cap holds, the excess moves
    assert 0.2 < firsts["cheap"] / (firsts["cheap"] + firsts["dear"]) < 0.55
    recent_429s = router.stats[cheap.id]["rl"]
    assert recent_429s < refusals_before  # fewer 429s once the cap holds
    capacity["cheap"] = 100.0  # the provider adds capacity
    drive(router, behaviour, 180, 500, 6.0, rng)  # +25 %/min while near the cap, no 429s
    firsts = drive(router, behaviour, 500, 600, 6.0, rng)
    assert router.stats[cheap.id]["cap"] > 4.0
    assert firsts["cheap"] / (firsts["cheap"] + firsts["dear"]) > 0.7


def test_it_raises_a_cap_that_holds_plans_back_though_the_endpoint_runs_far_below_it():
    """The cap bounds each request's share, so when only some requests want an endpoint (long
    prompts, say) it holds them back while the endpoint's total load stays far below the cap:
    "near the cap" never comes, and without this the cap would never grow back."""

    def load(held_back: bool) -> float:
        state: dict[str, float] = {"cap": 2.0, "capt": 0.0, "caps": -100.0}
        for k in range(1200):  # 0.5 answers/s for 40 min, no 429: a quarter of the cap
            t = k * 2.0
            if held_back:
                endpoint_capped(state, t, P)
            endpoint_observe(state, GOOD, t, P)
        return state["cap"]

    assert load(held_back=False) == 2.0
    assert load(held_back=True) > 100.0  # +25 %/min


def test_it_notes_each_plan_the_cap_held_back():
    cheap, dear = endpoint("cheap", 0.1), endpoint("dear", 0.6)
    router = Router([ModelConfig("m", (cheap, dear))])
    rng = random.Random(1)
    for k in range(100):  # 10 answers/s on each: the model runs at 20/s
        router.observe(cheap.id, GOOD, k * 0.1)
        router.observe(dear.id, GOOD, k * 0.1)
    router.stats[cheap.id]["cap"] = 1.0  # a twentieth of the model's rate
    plan = router.plan(PLAIN, 10.0, rng)
    assert plan.capped == (cheap.id,)  # it would have had far more than 5 %
    assert router.stats[cheap.id]["bcp"] == 1.0
    assert dear.id not in router.stats or "bcp" not in router.stats[dear.id]


def test_it_holds_the_cap_on_a_stray_429():
    state: dict[str, float] = {}
    for k in range(300):
        endpoint_observe(state, GOOD, k * 0.1, P)
    # The rate is read correctly from the first seconds on (no ramp-up bias) …
    assert math.isclose(attempt_rate(state, P), 10.0, rel_tol=0.05)
    endpoint_observe(state, Outcome("rate_limited", latency_s=0.1), 30.0, P)
    # … and one 429 among 300 answers sets no cap.
    assert state.get("cap", 0.0) == 0.0


def test_it_gives_a_quality_flagged_endpoint_only_a_test_share():
    flagged = EndpointConfig("m@q", "q", "m", 0.1, 0.01, 0.3, 131072, 8192, flagged=True)
    router = Router([ModelConfig("m", (A, flagged))])
    rng = random.Random(9)
    firsts = Counter(
        router.plan(RoutingRequest("m"), 0.0, rng).attempts[0].provider for _ in range(5000)
    )
    assert 0 < firsts["q"] < 30  # probe_share 0.2 % despite being the cheapest
    plan = router.plan(RoutingRequest("m"), 0.0, rng)
    assert ("m@q", "flagged") in plan.demoted


def test_it_flags_an_endpoint_with_malformed_tool_calls_far_above_its_peers():
    router = Router([ModelConfig("m", (A, B, C))])
    rng = random.Random(11)

    def behaviour(e, t):
        return checked_answer(bad=e is C and rng.random() < 0.4)

    drive(router, behaviour, 0, 300, 5.0, rng, RoutingRequest("m", features=frozenset({"tools"})))
    table = router.table("m", 300.0)
    assert table is not None and table.demoted == ["", "", "flagged"]


def test_it_holds_a_malformed_tool_call_flag_against_tool_requests_only():
    """G8's measured flag is about checked output: a plain answer from that endpoint is as good
    as ever, and the flag must not cost those requests the endpoint's lower price."""
    router = Router([ModelConfig("m", (A, B, C))])
    rng = random.Random(11)
    tools = RoutingRequest("m", features=frozenset({"tools"}))

    def behaviour(e, t):
        return checked_answer(bad=e is C and rng.random() < 0.4)

    drive(router, behaviour, 0, 300, 5.0, rng, tools)

    def first_choices(request: RoutingRequest) -> Counter[str]:
        return Counter(router.plan(request, 300.0, rng).attempts[0].provider for _ in range(4000))

    with_tools, plain = first_choices(tools), first_choices(RoutingRequest("m"))
    assert with_tools["c"] < 30  # probe share only
    assert plain["c"] > 400, plain  # its ordinary share
    assert ("m@c", "flagged") in router.plan(tools, 300.0, rng).demoted
    assert not router.plan(RoutingRequest("m"), 300.0, rng).demoted


def test_it_keeps_a_trickle_on_every_eligible_endpoint():
    slow = EndpointConfig("m@slow", "slow", "m", 5.0, 5.0, 15.0, 131072, 8192)
    router = Router([ModelConfig("m", (A, B, slow))])
    rng = random.Random(2)
    firsts = Counter(
        router.plan(RoutingRequest("m"), 0.0, rng).attempts[0].provider for _ in range(20000)
    )
    share = firsts["slow"] / 20000
    assert abs(share - P.floor_share) < 0.004  # ten times the cost: only the floor
