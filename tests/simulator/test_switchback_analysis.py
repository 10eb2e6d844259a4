"""Changes new/old − 1 and their bootstrap confidence intervals over block pairs."""

import random

import pytest

from simulator.switchback.analysis import FIELDS, arm_values, changes_estimate


def block(**values):
    stats = {f: 0 for f in FIELDS}
    stats.update(values)
    stats.setdefault("ttft_p50", None)
    return stats


def test_it_pools_an_arm_as_ratios_of_sums_so_busy_blocks_weigh_more():
    blocks = [
        block(requests=100, served=90, ttft_sum=90.0, cost_sum=0.9, provider_429=5, ttft_p50=1.0),
        block(requests=10, served=10, ttft_sum=30.0, cost_sum=0.1, broker_refusals=5, ttft_p50=3.0),
    ]
    values = arm_values(blocks)
    assert values["ttft_mean"] == pytest.approx(120 / 100)
    assert values["cost"] == pytest.approx(1.0 / 100)
    assert values["rate_limit"] == pytest.approx(5 / 110)  # provider 429s only
    assert values["broker_refusal"] == pytest.approx(5 / 110)
    assert values["ttft_p50"] == pytest.approx(2.0)  # mean of the blocks' medians
    assert values["served"] == pytest.approx(100 / 110)


def test_it_reports_each_change_as_new_over_old_minus_one():
    new = block(
        requests=100,
        served=100,
        ttft_sum=80.0,
        throughput_sum=12000.0,
        cost_sum=1.05,
        provider_429=1,
        broker_refusals=2,
        ttft_p50=0.8,
    )
    old = block(
        requests=100,
        served=100,
        ttft_sum=100.0,
        throughput_sum=10000.0,
        cost_sum=1.0,
        provider_429=5,
        broker_refusals=5,
        ttft_p50=1.0,
    )
    result = changes_estimate([(new, old)] * 5, seed=1)
    assert result["ttft_change"] == pytest.approx(-0.2)
    assert result["ttft_mean_change"] == pytest.approx(-0.2)
    assert result["throughput_change"] == pytest.approx(0.2)
    assert result["rate_limit_change"] == pytest.approx(-0.8)
    assert result["broker_refusal_change"] == pytest.approx(-0.6)
    assert result["cost_change"] == pytest.approx(0.05)
    # Identical pairs: every resample gives the same change.
    assert result["ci"]["ttft_change"] == pytest.approx([-0.2, -0.2])


def test_it_says_nothing_where_the_baseline_is_zero():
    new = block(requests=10, served=10, errors=1)
    old = block(requests=10, served=10, errors=0)
    result = changes_estimate([(new, old)] * 3, seed=1)
    assert result["error_change"] is None
    both_zero = changes_estimate([(old, old)] * 3, seed=1)
    assert both_zero["error_change"] == 0.0


def noisy_pairs(effect: float, n: int, seed: int):
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        level = rng.uniform(0.5, 2.0)  # block-to-block swings shared by both arms of a pair
        stats = []
        for arm_effect in (effect, 0.0):
            served = 1000
            ttft = level * (1 + arm_effect) * rng.gauss(1.0, 0.05)
            stats.append(
                block(
                    requests=served,
                    served=served,
                    ttft_sum=ttft * served,
                    ttft_p50=ttft,
                    cost_sum=served * level * 1e-3,
                )
            )
        pairs.append(tuple(stats))
    return pairs


def test_it_brackets_a_true_effect_and_excludes_zero_when_it_is_large():
    result = changes_estimate(noisy_pairs(-0.2, 28, seed=3), seed=7)
    lo, hi = result["ci"]["ttft_change"]
    assert lo < -0.2 < hi
    assert hi < 0.0


def test_it_covers_zero_for_no_effect_most_of_the_time():
    covered = 0
    for seed in range(40):
        lo, hi = changes_estimate(noisy_pairs(0.0, 28, seed=seed), seed=seed)["ci"]["ttft_change"]
        covered += lo <= 0.0 <= hi
    assert covered >= 34  # a 95 % interval, give or take the bootstrap's small-sample optimism


def test_it_is_deterministic_under_its_seed():
    pairs = noisy_pairs(0.1, 10, seed=1)
    assert changes_estimate(pairs, seed=5) == changes_estimate(pairs, seed=5)


def test_it_prices_the_answers_an_agent_can_use_apart_from_every_answer():
    # The old router's answers are cheaper, but one in ten has a malformed tool call the agent
    # must ask again for; the new router pays 8 % more per answer and gets one bad in a hundred.
    new = block(requests=100, served=100, good_answers=99, cost_sum=1.08)
    old = block(requests=100, served=100, good_answers=90, cost_sum=1.0)
    result = changes_estimate([(new, old)] * 5, seed=1)
    assert result["cost_change"] == pytest.approx(0.08)
    assert result["cost_per_good_change"] == pytest.approx((1.08 / 99) / (1.0 / 90) - 1)  # −1.8 %
