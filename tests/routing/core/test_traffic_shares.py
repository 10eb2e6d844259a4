"""Traffic shares (SPEC G9, G10, G14): band, floor, cap, weighted order."""

import itertools
import math
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core.guards import fill
from routing.core.parameters import RoutingParameters
from routing.core.shares import band_weight, band_weights, weighted_order

P = RoutingParameters()


def test_it_shares_smoothly_inside_the_band_and_falls_fast_beyond():
    assert band_weight(1.0, P) == 1.0
    assert math.isclose(band_weight(1.05, P), math.exp(-0.05 / P.beta))
    edge = band_weight(1.0 + P.band, P)
    # Continuous at the band edge, then the slope is beta/beta_outside times steeper.
    assert math.isclose(band_weight(1.0 + P.band + 1e-9, P), edge, rel_tol=1e-6)
    inside_drop = band_weight(1.0 + P.band - 0.05, P) / edge
    outside_drop = edge / band_weight(1.0 + P.band + 0.05, P)
    assert outside_drop > inside_drop**5


def test_it_takes_the_best_cost_among_endpoints_with_weight():
    weights = band_weights([1.0, 1.1, 0.5], [1.0, 1.0, 0.0], P)  # the 0.5 one is breaker-open
    assert weights[0] == 1.0 and weights[2] == 0.0
    assert math.isclose(weights[1], math.exp(-0.1 / P.beta))


bounded = st.integers(min_value=1, max_value=12).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=n, max_size=n),
        st.lists(st.floats(min_value=0.0, max_value=0.08), min_size=n, max_size=n),
        st.lists(st.floats(min_value=0.0, max_value=1.5), min_size=n, max_size=n),
    )
)


@settings(max_examples=400, deadline=None)
@given(bounded)
def test_it_sums_shares_to_one_within_floor_and_cap(case):
    weights, lower, upper = case
    upper = [max(lo, hi) for lo, hi in zip(lower, upper, strict=True)]
    shares = fill(weights, lower, upper)
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-9)
    if sum(lower) <= 1.0 <= sum(upper) and sum(weights) > 0:
        for x, lo, hi in zip(shares, lower, upper, strict=True):
            assert lo - 1e-12 <= x <= hi + 1e-12
        # Free shares (strictly between their bounds) stay proportional to their weights.
        free = [
            (x, w)
            for x, w, lo, hi in zip(shares, weights, lower, upper, strict=True)
            if lo + 1e-9 < x < hi - 1e-9
        ]
        for (x1, w1), (x2, w2) in itertools.pairwise(free):
            assert math.isclose(x1 * w2, x2 * w1, rel_tol=1e-6, abs_tol=1e-12)


def test_it_gives_every_endpoint_its_floor():
    shares = fill([1.0, 1e-9, 0.0], [0.01, 0.01, 0.01], [1.0, 1.0, 1.0])
    assert shares[1] == 0.01 and shares[2] == 0.01
    assert math.isclose(shares[0], 0.98)


def test_it_redistributes_what_a_capped_endpoint_cannot_take():
    shares = fill([0.6, 0.3, 0.1], [0.0, 0.0, 0.0], [0.2, 1.0, 1.0])
    assert math.isclose(shares[0], 0.2)
    # The excess 0.4 goes to the others in proportion to their weights (3:1).
    assert math.isclose(shares[1], 0.6) and math.isclose(shares[2], 0.2)


def test_it_spreads_by_caps_when_every_endpoint_is_at_its_cap():
    shares = fill([0.5, 0.5], [0.0, 0.0], [0.3, 0.1])
    assert math.isclose(shares[0], 0.75) and math.isclose(shares[1], 0.25)


def test_it_draws_the_order_in_proportion_to_the_shares():
    rng = random.Random(42)
    shares = [0.6, 0.3, 0.1]
    firsts, seconds = Counter(), Counter()
    n = 30000
    for _ in range(n):
        order = weighted_order(shares, rng)
        assert sorted(order) == [0, 1, 2]
        firsts[order[0]] += 1
        if order[0] == 0:
            seconds[order[1]] += 1
    for i, share in enumerate(shares):
        assert abs(firsts[i] / n - share) < 0.012
    # A retry draws from the remaining endpoints: after 0, index 1 comes next 3 times in 4.
    assert abs(seconds[1] / firsts[0] - 0.75) < 0.015


def test_it_puts_zero_share_endpoints_last():
    assert weighted_order([0.0, 1.0, 0.0], random.Random(1))[0] == 1
