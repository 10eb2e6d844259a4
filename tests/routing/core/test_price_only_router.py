"""The price-only router, baseline of the switchback experiment (SPEC G16)."""

import math
import random
from collections import Counter

from routing.core import EndpointConfig, ModelConfig, Outcome, Router, RoutingRequest
from routing.core.legacy import price_only_order, price_only_shares

A = EndpointConfig("m@a", "a", "m", 0.5, 0.05, 1.5, 131072, 8192)
B = EndpointConfig("m@b", "b", "m", 0.8, 0.08, 2.4, 131072, 8192)
C = EndpointConfig("m@c", "c", "m", 0.3, 0.3, 3.0, 131072, 8192)


def test_it_shares_by_the_inverse_square_of_the_listed_input_price():
    shares = price_only_shares([0.5, 0.8, 0.3], [False, False, False])
    inv = [1 / 0.25, 1 / 0.64, 1 / 0.09]
    for share, w in zip(shares, inv, strict=True):
        assert math.isclose(share, w / sum(inv))


def test_it_reproduces_the_shares_in_the_plan():
    router = Router([ModelConfig("m", (A, B, C))], default_strategy="price_only")
    rng = random.Random(4)
    n = 20000
    firsts = Counter(
        router.plan(RoutingRequest("m"), 0.0, rng).attempts[0].provider for _ in range(n)
    )
    expected = dict(zip("abc", price_only_shares([0.5, 0.8, 0.3], [False] * 3), strict=True))
    for name, share in expected.items():
        assert abs(firsts[name] / n - share) < 0.01


def test_it_sends_a_failure_to_the_next_cheapest():
    rng = random.Random(1)
    for _ in range(200):
        order = price_only_order([0.5, 0.8, 0.3], [False] * 3, rng)
        rest = [[0.5, 0.8, 0.3][i] for i in order[1:]]
        assert rest == sorted(rest)


def test_it_skips_endpoints_with_an_outage_in_the_last_30_seconds():
    router = Router([ModelConfig("m", (A, B, C))], default_strategy="price_only")
    for k in range(20):
        router.observe(C.id, Outcome("fault", latency_s=0.2), 90.0 + k * 0.5)
        router.observe(A.id, Outcome("ok", latency_s=2.0, ttft_s=0.3), 90.0 + k * 0.5)
    rng = random.Random(2)
    plans = [router.plan(RoutingRequest("m"), 100.0, rng) for _ in range(2000)]
    assert all(p.attempts[0].provider != "c" for p in plans)
    assert all(p.attempts[-1].provider == "c" for p in plans)
    # A minute and a half later the failures have faded: c is the cheapest again.
    later = Counter(
        router.plan(RoutingRequest("m"), 200.0, rng).attempts[0].provider for _ in range(2000)
    )
    assert later["c"] > 1000


def test_it_uses_everyone_when_everyone_is_down():
    shares = price_only_shares([0.5, 0.3], [True, True])
    assert math.isclose(sum(shares), 1.0) and min(shares) > 0
