"""The switchback's discrete-event loop: time order, ties, run(until)."""

from hypothesis import given
from hypothesis import strategies as st

from simulator.switchback.loop import NORMAL, URGENT, EventLoop


def test_it_runs_events_in_time_order_and_sets_now_for_each():
    loop = EventLoop(100.0)
    seen = []
    for at in (105.0, 101.0, 103.0):
        loop.schedule(at, lambda arg: seen.append((arg, loop.now)), at)
    loop.run(200.0)
    assert seen == [(101.0, 101.0), (103.0, 103.0), (105.0, 105.0)]
    assert loop.now == 200.0


def test_it_breaks_ties_by_priority_then_by_scheduling_order():
    loop = EventLoop()
    seen = []
    loop.schedule(1.0, seen.append, "a")
    loop.schedule(1.0, seen.append, "b")
    loop.schedule(1.0, seen.append, "switch", priority=URGENT)
    loop.schedule(1.0, seen.append, "c", priority=NORMAL)
    loop.run(2.0)
    assert seen == ["switch", "a", "b", "c"]


def test_it_leaves_events_at_or_after_until_for_the_next_run():
    loop = EventLoop()
    seen = []
    loop.schedule(5.0, seen.append, 5)
    loop.schedule(10.0, seen.append, 10)
    loop.run(10.0)
    assert seen == [5] and loop.pending == 1
    loop.run(11.0)
    assert seen == [5, 10]


def test_it_runs_what_an_action_schedules_for_now_in_the_same_run():
    loop = EventLoop()
    seen = []

    def chain(n):
        seen.append((n, loop.now))
        if n < 3:
            loop.schedule(loop.now, chain, n + 1)

    loop.schedule(2.0, chain, 0)
    loop.run(3.0)
    assert seen == [(0, 2.0), (1, 2.0), (2, 2.0), (3, 2.0)]


def test_it_never_schedules_into_the_past():
    loop = EventLoop()
    loop.run(10.0)
    times = []
    loop.schedule(3.0, lambda _: times.append(loop.now))
    loop.run(20.0)
    assert times == [10.0]


@given(st.lists(st.tuples(st.floats(0, 1000), st.integers(-1, 1)), max_size=60))
def test_it_is_a_stable_sort_by_time_and_priority(events):
    loop = EventLoop()
    seen = []
    for k, (at, prio) in enumerate(events):
        loop.schedule(at, seen.append, k, priority=prio)
    loop.run(2000.0)
    expected = sorted(range(len(events)), key=lambda k: (events[k][0], events[k][1], k))
    assert seen == expected
