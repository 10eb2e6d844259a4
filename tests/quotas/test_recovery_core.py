"""When a learning epoch may end (quotas.core.recovery): new from lost, and a lost state healed
by the reports of the processes that still hold its reservations. The clock is an argument."""

from quotas.core.recovery import (
    LIVE_SECONDS,
    REPORT_SECONDS,
    Epoch,
    Member,
    holds_until,
    recovery_decide,
)

LEASE = 30.0
BORN = 1000.0
EPOCH = Epoch(BORN, BORN + LEASE)  # as a script creates it: learning for one maximum lease


def decide(members, reported, now):
    return recovery_decide(EPOCH, members, reported, now=now, max_lease=LEASE)


def test_a_new_deployment_ends_learning_at_once_and_refill_buckets_start_full():
    # The first process reported before it registered, so its row comes with its report.
    me = Member("gateway:a", started=BORN + 0.01, last_seen=BORN + 0.01)
    verdict = decide([me], {"gateway:a"}, now=BORN + 0.02)
    assert verdict.ends_at == BORN + 0.02
    assert not verdict.lost
    assert verdict.born == 0.0  # nothing ever took from a bucket


def test_processes_starting_together_each_find_the_others_reported():
    a = Member("gateway:a", BORN + 0.1, BORN + 0.1)
    b = Member("gateway:b", BORN + 0.2, BORN + 0.2)
    worker = Member("worker:c", BORN + 0.3, BORN + 0.3)
    verdict = decide([a, b, worker], {"gateway:a", "gateway:b", "worker:c"}, now=BORN + 0.3)
    assert verdict.ends_at == BORN + 0.3 and not verdict.lost


def test_members_long_gone_do_not_hold_a_new_redis_back():
    # A deployment stopped an hour ago and started again on an empty Redis.
    old = Member("gateway:old", started=BORN - 7200, last_seen=BORN - 3600)
    me = Member("gateway:new", BORN + 0.1, BORN + 0.1)
    verdict = decide([old, me], {"gateway:new"}, now=BORN + 0.1)
    assert verdict.ends_at == BORN + 0.1
    assert not verdict.lost
    # Refill buckets count as emptied when the old deployment was last seen, no later.
    assert verdict.born == BORN - 3600 + LIVE_SECONDS


def test_a_lost_state_waits_for_every_live_process_to_report():
    a = Member("gateway:a", started=BORN - 600, last_seen=BORN + 0.5)
    b = Member("gateway:b", started=BORN - 600, last_seen=BORN + 0.9)
    verdict = decide([a, b], {"gateway:a"}, now=BORN + 1.0)
    assert verdict.ends_at is None
    assert verdict.waiting_for == ("gateway:b",)
    assert verdict.lost
    # Retry-After: a live process reports within a couple of heartbeats.
    assert verdict.expected_end == BORN + 1.0 + REPORT_SECONDS


def test_once_every_live_process_reported_learning_ends_within_seconds():
    a = Member("gateway:a", started=BORN - 600, last_seen=BORN + 0.5)
    b = Member("gateway:b", started=BORN - 600, last_seen=BORN + 1.1)
    verdict = decide([a, b], {"gateway:a", "gateway:b"}, now=BORN + 1.2)
    assert verdict.ends_at == BORN + 1.2
    assert verdict.lost
    assert verdict.born == BORN  # refill buckets still count as emptied at the loss


def test_a_process_that_died_just_before_the_loss_holds_learning_for_its_leases():
    live = Member("gateway:a", started=BORN - 600, last_seen=BORN + 1.0)
    dead = Member("gateway:b", started=BORN - 600, last_seen=BORN - 10.0)
    verdict = decide([live, dead], {"gateway:a"}, now=BORN + 1.2)
    # It renewed nothing after it stopped: its leases end one lease after it was last alive.
    assert verdict.ends_at == BORN - 10.0 + LIVE_SECONDS + LEASE
    assert verdict.ends_at < EPOCH.until


def test_a_process_that_died_after_the_loss_unreported_holds_learning_to_the_epoch_end():
    live = Member("gateway:a", started=BORN - 600, last_seen=BORN + 10.0)
    dead = Member("gateway:b", started=BORN - 600, last_seen=BORN + 2.0)
    verdict = decide([live, dead], {"gateway:a"}, now=BORN + 10.0)
    assert verdict.ends_at == EPOCH.until  # its leases in the lost state ran to born + lease


def test_a_silent_process_is_waited_for_until_it_counts_as_stopped():
    a = Member("gateway:a", started=BORN - 600, last_seen=BORN + 1.0)
    b = Member("gateway:b", started=BORN - 600, last_seen=BORN - 0.5)
    still_live = decide([a, b], {"gateway:a"}, now=BORN - 0.5 + LIVE_SECONDS)
    assert still_live.waiting_for == ("gateway:b",)
    stopped = decide([a, b], {"gateway:a"}, now=BORN - 0.5 + LIVE_SECONDS + 0.01)
    assert stopped.waiting_for == ()
    assert stopped.ends_at == holds_until(b, BORN, LEASE, LIVE_SECONDS) == BORN + LEASE


def test_the_decision_never_ends_learning_after_the_epoch_itself_does():
    dead = Member("gateway:b", started=BORN - 600, last_seen=BORN + 25.0)
    verdict = decide([dead], set(), now=BORN + 29.0)
    assert verdict.ends_at == EPOCH.until
    assert decide([dead], set(), now=EPOCH.until).ends_at == EPOCH.until


def test_a_process_started_during_the_recovery_is_waited_for_only_while_it_is_silent():
    old = Member("gateway:a", started=BORN - 600, last_seen=BORN + 1.0)
    fresh = Member("gateway:c", started=BORN + 0.5, last_seen=BORN + 0.5)
    assert decide([old, fresh], {"gateway:a"}, now=BORN + 1.0).waiting_for == ("gateway:c",)
    # Stopped without reporting: it joined after the loss, so held nothing of the lost state.
    later = BORN + 0.5 + LIVE_SECONDS + 0.1
    assert decide([old, fresh], {"gateway:a"}, now=later).ends_at == later


def test_an_epoch_that_is_not_learning_is_left_alone():
    verdict = recovery_decide(Epoch(0.0, 0.0), [], set(), now=BORN, max_lease=LEASE)
    assert verdict.ends_at == 0.0 and verdict.waiting_for == ()
