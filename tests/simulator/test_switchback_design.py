"""The switchback design: paired blocks in a seeded random order, and parallel segments."""

from types import SimpleNamespace

from simulator.switchback.design import DAY, NEW, OLD, Design, segments_plan
from simulator.switchback.report import arm_side, report_title

WEEK = Design(block_s=3 * 3600.0, warmup_s=3600.0, duration_s=7 * DAY, seed=7)


def test_it_runs_each_router_once_per_pair():
    orders = WEEK.orders()
    assert len(orders) == WEEK.pairs == 28
    for pair in range(WEEK.pairs):
        arms = {WEEK.arm_of(2 * pair, orders), WEEK.arm_of(2 * pair + 1, orders)}
        assert arms == {0, 1}


def test_it_draws_the_order_of_each_pair_from_the_seed():
    assert WEEK.orders() == WEEK.orders()
    other = Design(WEEK.block_s, WEEK.warmup_s, WEEK.duration_s, seed=8)
    assert other.orders() != WEEK.orders()
    # Neither router always goes first: a fair coin over 28 pairs.
    assert 5 < sum(WEEK.orders()) < 23


def test_it_balances_the_order_over_days_and_time_slots():
    orders = WEEK.orders()
    days = [orders[4 * d : 4 * d + 4] for d in range(7)]
    assert all(sum(day) == 2 for day in days)  # each day: new first in 2 of its 4 pairs
    for slot in range(4):
        assert sum(day[slot] for day in days) in (3, 4)  # each slot: 3 or 4 of 7 days
    # Another seed draws another balanced schedule.
    assert Design(WEEK.block_s, WEEK.warmup_s, WEEK.duration_s, seed=8).orders() != orders


def test_it_flips_coins_when_a_day_holds_no_whole_number_of_pairs():
    odd = Design(block_s=5 * 3600.0, warmup_s=3600.0, duration_s=7 * DAY, seed=1)
    assert len(odd.orders()) == odd.pairs == 16


def test_it_names_the_arms_treatment_first():
    assert WEEK.arms == (NEW, OLD)


def test_it_measures_every_block_in_exactly_one_segment():
    for count in (1, 2, 3, 4):
        segments = segments_plan(WEEK, count)
        covered = [b for s in segments for b in range(s.first_block, s.end_block)]
        assert covered == list(range(WEEK.blocks))
        for s in segments:
            assert s.first_block % 2 == 0  # cut at pair boundaries
            assert s.start_s <= s.first_block * WEEK.block_s


def test_it_warms_a_segment_up_from_a_local_midnight_or_six_hours_before_one():
    for segment in segments_plan(WEEK, 2)[1:]:
        split = segment.first_block * WEEK.block_s
        if split % DAY == 0:
            assert segment.start_s == split - 6 * 3600
        else:
            assert segment.start_s <= (split // DAY) * DAY


def test_it_balances_two_segments_of_a_week():
    first, second = segments_plan(WEEK, 2)
    loads = [first.end_s - first.start_s, second.end_s - second.start_s]
    assert max(loads) <= 96 * 3600


def test_it_tells_the_plots_each_blocks_arm_when_both_arms_run_one_strategy():
    # An A/A run (or arms that differ in stream reservation only): the strategy's name cannot
    # say which arm a block ran; its place in the pair does.
    design = Design(3 * 3600.0, 3600.0, 2 * DAY, 7, arms=("routing_cost", "routing_cost"))
    run = SimpleNamespace(design=design)
    sides = [arm_side(run, block) for block in range(2 * design.pairs)]  # type: ignore[arg-type]
    assert all({sides[2 * p], sides[2 * p + 1]} == {"new", "old"} for p in range(design.pairs))
    first = ["new" if first else "old" for first in design.orders()]
    assert sides[0::2] == first


def test_it_titles_the_report_by_what_the_arms_compare():
    def exp(new: str, old: str, modes: tuple[str, str] | None = None) -> dict:
        reservation = None if modes is None else {"new": modes[0], "old": modes[1]}
        return {"arms": {"new": new, "old": old}, "stream_reservation": reservation}

    assert report_title(exp(NEW, OLD)) == "`routing_cost` router vs `price_only`"
    assert report_title(exp(NEW, NEW)) == "`routing_cost` against itself (A/A)"
    assert report_title(exp(NEW, NEW, ("max", "max"))) == "`routing_cost` against itself (A/A)"
    assert report_title(exp(NEW, NEW, ("increments", "max"))) == (
        "streams reserving `increments` vs `max` (C10), one router"
    )
