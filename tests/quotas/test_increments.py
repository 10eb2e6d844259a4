"""Streaming reservations in steps (C10): how much a stream reserves at admission and when it
asks for more, by hand-computed examples."""

import pytest

from quotas.core.increments import StepPlan


def test_a_stream_reserves_one_step_at_admission_never_more_than_its_maximum():
    plan = StepPlan(step_tokens=256)
    assert plan.first_step(4096) == 256
    assert plan.first_step(100) == 100  # a small max_tokens is reserved whole, as by default


def test_it_tops_up_by_one_step_once_less_than_the_headroom_is_left():
    plan = StepPlan(step_tokens=256)  # headroom: half a step, 128
    assert plan.top_up(reserved=256, generated=128, max_output=4096) == 0  # 128 left: enough
    assert plan.top_up(reserved=256, generated=129, max_output=4096) == 256  # 127 left
    assert plan.top_up(reserved=512, generated=400, max_output=4096) == 256


def test_the_last_step_stops_at_the_maximum_and_none_follows():
    plan = StepPlan(step_tokens=256, headroom_tokens=64)
    assert plan.top_up(reserved=3968, generated=3950, max_output=4096) == 128
    assert plan.top_up(reserved=4096, generated=4095, max_output=4096) == 0


def test_a_stream_that_outran_its_reservation_asks_for_what_it_made_plus_the_headroom():
    # A top-up landed late: the buckets should count the 250 tokens already made beyond it.
    plan = StepPlan(step_tokens=100, headroom_tokens=10)
    assert plan.top_up(reserved=100, generated=350, max_output=1000) == 260  # 360 - 350 = 10
    assert plan.top_up(reserved=100, generated=990, max_output=1000) == 900  # capped


@pytest.mark.parametrize("step, headroom", [(0, None), (100, 101), (100, -1)])
def test_a_plan_that_cannot_work_is_refused(step, headroom):
    with pytest.raises(ValueError):
        StepPlan(step_tokens=step, headroom_tokens=headroom)
