"""Cache-aware stickiness (SPEC G12) and conversation keys."""

import random

from routing.core import (
    EndpointConfig,
    ModelConfig,
    Outcome,
    Router,
    RoutingRequest,
    StickyState,
    conversation_key,
    provider_preferences_parse,
)
from routing.core.sticky import expected_cache_saving, sticky_keeps

A = EndpointConfig("m@a", "a", "m", 0.5, 0.05, 1.5, 131072, 8192, cache_ttl_s=300.0)
B = EndpointConfig("m@b", "b", "m", 0.5, 0.05, 1.5, 131072, 8192)
DEAR = EndpointConfig("m@dear", "dear", "m", 3.0, 0.3, 9.0, 131072, 8192)
NOW = 1000.0


def make_router(fail_a=False):
    router = Router([ModelConfig("m", (A, B, DEAR))])
    for k in range(400):
        t = NOW - 200 + k * 0.5
        for e in (A, B, DEAR):
            outcome = Outcome("ok", latency_s=4.0, ttft_s=0.5, input_tokens=3000, output_tokens=300)
            if fail_a and e is A and t > NOW - 20:
                outcome = Outcome("fault", latency_s=0.2)
            router.observe(e.id, outcome, t)
    return router


def sticky_plan(router, pinned, *, last_used=NOW - 10, prefix=20000.0, seed=0, **kw):
    state = StickyState(pinned.id, last_used, prefix)
    return router.plan(RoutingRequest("m", sticky=state, **kw), NOW, random.Random(seed))


def test_it_stays_on_a_warm_available_endpoint():
    router = make_router()
    for seed in range(50):
        p = sticky_plan(router, A, seed=seed)
        assert p.sticky and p.attempts[0] is A and p.sticky_reason == "warm"
        assert len(p.attempts) == 3  # the rest of the plan is still there for retries


def test_it_moves_when_the_cache_is_cold():
    p = sticky_plan(make_router(), A, last_used=NOW - 301)
    assert not p.sticky and p.sticky_reason == "cold"


def test_it_moves_when_the_pinned_endpoint_becomes_unavailable():
    p = sticky_plan(make_router(fail_a=True), A)
    assert not p.sticky and p.sticky_reason == "unavailable"
    ignored = sticky_plan(make_router(), A, provider=provider_preferences_parse({"ignore": ["a"]}))
    assert not ignored.sticky and ignored.sticky_reason == "unavailable"


def test_under_a_stated_bound_it_leaves_when_the_cost_gap_exceeds_the_expected_cache_saving():
    router = make_router()
    stated = provider_preferences_parse({"max_cost_premium": 0.06})
    small = sticky_plan(router, DEAR, prefix=1000.0, provider=stated)
    assert not small.sticky and small.sticky_reason == "cost_gap"
    # A long warm prefix on the dear endpoint saves more than the gap: stay.
    large = sticky_plan(router, DEAR, prefix=2_000_000.0, provider=stated)
    assert large.sticky and large.attempts[0] is DEAR
    # Under the default guards it stays while warm, as under price-only (G12's plain rule).
    plain = sticky_plan(router, DEAR, prefix=1000.0)
    assert plain.sticky and plain.sticky_reason == "warm"


def test_it_computes_the_saving_from_the_cached_discount_and_hit_probability():
    saving = expected_cache_saving(A, prefix_tokens=10000, hit_probability=0.9)
    assert abs(saving - 10000 * (0.5 - 0.05) / 1e6 * 0.9) < 1e-15
    assert sticky_keeps(pinned_cost=1.0, best_cost=0.9, expected_saving=0.1)
    assert not sticky_keeps(pinned_cost=1.0, best_cost=0.9, expected_saving=0.099)


def test_it_always_sticks_while_warm_under_the_price_only_router():
    router = make_router()
    router.default_strategy = "price_only"
    p = sticky_plan(router, DEAR, prefix=1000.0)
    assert p.sticky and p.attempts[0] is DEAR


def test_it_lets_a_pinned_crowd_leave_an_endpoint_over_its_cap():
    router = make_router()
    state = router.stats[A.id]
    state["cap"], state["capt"], state["caps"] = 0.5, NOW, NOW  # a quarter of its 2 attempts/s
    stays = sum(sticky_plan(router, A, seed=s).sticky for s in range(400))
    assert 60 < stays < 140  # keep probability = cap / load ≈ 0.25


def test_it_keys_conversations_by_session_user_or_leading_messages():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*msgs, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    by_messages = conversation_key(tenant="t1", model="m", messages=msgs)
    assert by_messages == conversation_key(tenant="t1", model="m", messages=later)
    other = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "yo"}]
    assert by_messages != conversation_key(tenant="t1", model="m", messages=other)
    assert by_messages != conversation_key(tenant="t2", model="m", messages=msgs)
    session = conversation_key(tenant="t1", model="m", session_id="s1", user="u", messages=msgs)
    assert session == conversation_key(tenant="t1", model="m", session_id="s1")
    assert conversation_key(tenant="t1", model="m", user="u") != session
    assert conversation_key(tenant="t1", model="m") is None
