"""One contract suite for the fair queue on Redis (Lua) and its in-memory twin (QueueBook),
on an explicit clock: fast path, fair order, skipping flows held by their own limits, the apps
of one tenant in lanes of its flow, deadlines, depth limits and eviction, wake-up on release,
pauses, the waiters of a process that died — and both make the same decisions."""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio

from quotas.core.fairqueue import MAILBOX_ALIVE_SECONDS, Pumped, Queued, QueueReason, QueueRefusal
from quotas.core.model import BucketSpec, Dimension, Grant, Reason, Rule, Usage
from quotas.core.queuebook import QueueBook
from quotas.store.memory import AsyncMemoryStore, MemoryReservationStore
from quotas.store.queue_memory import MemoryQueueStore
from quotas.store.queue_redis import LUA, RedisQueueStore
from quotas.store.redis import RedisReservationStore
from tests.quotas.conftest import REDIS_URL, SyncStore, delete_prefix, unique_prefix

T0 = 1_700_000_000.0
POOL = "provider:alpha"
# The pool: 1000 tokens, refilled in 10 s (100 tokens/s).
TPM = BucketSpec("alpha-tpm", POOL, Dimension.TOTAL_TOKENS, Rule.REFILL, 1000, 10)
SLOTS = BucketSpec("alpha-conc", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 2)
# Input tokens: 1000 refilled in 10 s, like TPM, but what a request takes here it keeps.
ITPM = BucketSpec("alpha-itpm", POOL, Dimension.INPUT_TOKENS, Rule.REFILL, 1000, 10)
ROUTE = BucketSpec("route-rpm", "model:7", Dimension.REQUESTS, Rule.REFILL, 1000, 60)


def tenant(name: str, rpm: float = 1000) -> BucketSpec:
    return BucketSpec(f"{name}-rpm", f"tenant:{name}", Dimension.REQUESTS, Rule.REFILL, rpm, 60)


def app(name: str, rpm: float = 1000, per: float = 60) -> BucketSpec:
    return BucketSpec(f"{name}-rpm", f"app:{name}", Dimension.REQUESTS, Rule.REFILL, rpm, per)


def tokens(n: float) -> Usage:
    return Usage(input_tokens=n)


@dataclass
class Fixture:
    """A live gateway process (``q``: its listener reads at every step's time) and a second
    one (``other``) on the same queue, with its own mailbox, which a test may let die."""

    q: SyncStore  # the QueueStore, run synchronously
    store: SyncStore  # the ReservationStore underneath (levels, pause)
    kind: str
    other: SyncStore
    now: float = T0  # the last step's time
    beside: int = 0  # see ``_scenario``

    def enter(
        self, rid: str, buckets: list[BucketSpec], demand: Usage, *, via: Any = None, **kw: Any
    ) -> Any:
        args = dict(
            pool=POOL,
            flow=buckets[0].scope,
            weight=1.0,
            deadline=T0 + 1000,
            max_depth=100,
            flow_depth=50,
            lease_seconds=30.0,
            burst=0.0,
            now=T0,
        )
        args.update(kw)
        q = self.q if via is None else via
        self.now = args["now"]
        q.keep_alive(now=self.now)  # the process entering is alive
        return q.enter(rid, buckets, demand, **args)

    def mail(self, via: Any = None) -> dict[str, Any]:
        return dict((via or self.q).mail(timeout=0, now=self.now))

    def pump(self, now: float) -> Pumped:
        self.now = now
        self.q.keep_alive(now=now)  # its listener has been reading all along
        return self.q.pump(POOL, now=now)


def make_fixture(kind: str, runner: asyncio.Runner) -> tuple[Fixture, Any]:
    if kind == "memory":
        memory = MemoryReservationStore(clock=lambda: T0)
        qb = QueueBook(memory.book, alive_seconds=MAILBOX_ALIVE_SECONDS)
        fx = Fixture(
            SyncStore(MemoryQueueStore(qb, clock=lambda: T0), runner, lambda: None),
            SyncStore(AsyncMemoryStore(memory), runner, memory.lose_state),
            kind,
            SyncStore(MemoryQueueStore(qb, clock=lambda: T0, mailbox="p2"), runner, lambda: None),
        )
        return fx, lambda: None
    prefix = unique_prefix()
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    store = RedisReservationStore(client, prefix=prefix)
    runner.run(store.bootstrap())
    fx = Fixture(
        SyncStore(RedisQueueStore(store), runner, lambda: None),
        SyncStore(store, runner, lambda: delete_prefix(REDIS_URL, prefix)),
        kind,
        SyncStore(RedisQueueStore(store, mailbox="p2"), runner, lambda: None),
    )

    def cleanup() -> None:
        runner.run(client.aclose())
        delete_prefix(REDIS_URL, prefix)

    return fx, cleanup


@pytest.fixture(params=["memory", "redis"])
def fq(request: pytest.FixtureRequest, runner: asyncio.Runner) -> Iterator[Fixture]:
    fx, cleanup = make_fixture(request.param, runner)
    try:
        yield fx
    finally:
        cleanup()


def test_it_grants_at_once_when_nobody_waits_and_it_fits(fq):
    grant = fq.enter("r1", [tenant("a"), TPM], tokens(400))
    assert isinstance(grant, Grant) and grant.taken() == {"a-rpm": 1, "alpha-tpm": 400}
    assert fq.store.levels([TPM], now=T0)[0].available == 600
    # A lease like any other: reconcile gives back what was not used.
    fq.store.reconcile(grant, tokens(100), now=T0)
    assert fq.store.levels([TPM], now=T0)[0].available == 900


def test_it_refuses_an_unsatisfiable_request_at_once_and_never_queues_it(fq):
    refusal = fq.enter("big", [tenant("a"), TPM], tokens(5000))
    assert isinstance(refusal, QueueRefusal)
    assert (refusal.reason, refusal.bucket, refusal.queue_id) == (
        Reason.UNSATISFIABLE,
        "alpha-tpm",
        "",
    )
    assert math.isinf(refusal.retry_at)
    assert fq.pump(T0).depth == 0


def test_it_queues_what_does_not_fit_and_grants_it_when_the_pool_refills(fq):
    fq.enter("r1", [tenant("a"), TPM], tokens(900))
    queued = fq.enter("r2", [tenant("a"), TPM], tokens(500))
    assert isinstance(queued, Queued) and queued.queue_id == "r2"
    assert queued.next_fit == pytest.approx(T0 + 4, abs=1e-5)  # 400 missing at 100/s
    assert fq.pump(T0 + 3).granted == 0
    pumped = fq.pump(T0 + 4.01)
    assert (pumped.granted, pumped.depth, pumped.next_fit) == (1, 0, math.inf)
    got = fq.mail()
    assert isinstance(got["r2"], Grant) and got["r2"].created_at == T0 + 4.01
    assert got["r2"].taken() == {"a-rpm": 1, "alpha-tpm": 500}


def test_it_does_not_let_a_small_newcomer_overtake_the_head_of_the_line(fq):
    fq.enter("b0", [tenant("b"), TPM], tokens(600))
    fq.enter("a0", [tenant("a"), TPM], tokens(300))
    fq.enter("big", [tenant("a"), TPM], tokens(800))  # waits for 700 more tokens
    small = fq.enter("small", [tenant("b"), TPM], tokens(50), now=T0 + 1)
    # 200 tokens would fit 'small', but b has had more than a: 'big' has the smaller tag.
    assert isinstance(small, Queued)
    fq.pump(T0 + 7.01)
    assert list(fq.mail()) == ["big"]


def test_it_serves_a_quiet_tenant_before_a_backlogged_one(fq):
    fq.enter("a0", [tenant("a"), TPM], tokens(1000))
    for i in range(1, 5):
        assert isinstance(fq.enter(f"a{i}", [tenant("a"), TPM], tokens(100)), Queued)
    fq.enter("b1", [tenant("b"), TPM], tokens(100), now=T0 + 0.5)
    order = []
    for t in range(1, 7):
        fq.pump(T0 + t + 0.001)
        order += list(fq.mail())
    # b1 came last but b has had nothing: its tag (V) is below a1's (a's 1000 tokens).
    assert order == ["b1", "a1", "a2", "a3", "a4"]


@pytest.mark.parametrize(("cost", "order"), [(None, ["a1", "b1"]), (1000.0, ["b1", "a1"])])
def test_it_charges_a_flow_the_cost_it_is_given_not_the_amount_reserved(fq, cost, order):
    """A stream in steps (C10) reserves its first step but is charged its whole estimate."""
    fq.enter("b0", [tenant("b"), TPM], tokens(500))
    assert isinstance(fq.enter("a0", [tenant("a"), TPM], tokens(100), cost=cost), Grant)
    assert fq.store.levels([TPM], now=T0)[0].available == 400  # it took 100 either way
    fq.enter("c0", [tenant("c"), TPM], tokens(400))
    fq.enter("a1", [tenant("a"), TPM], tokens(100))
    fq.enter("b1", [tenant("b"), TPM], tokens(100))
    served = []
    for t in (1, 2):
        fq.pump(T0 + t + 0.001)
        served += list(fq.mail())
    # a's last finish tag is 100 (what it reserved) or 1000 (its cost); b's is 500.
    assert served == order


def test_it_skips_a_flow_held_back_by_its_own_bucket(fq):
    own = tenant("a", rpm=1)  # one request per minute
    fq.enter("a1", [own, TPM], tokens(1000))
    fq.enter("a2", [own, TPM], tokens(100))
    fq.enter("b1", [tenant("b"), TPM], tokens(100))
    pumped = fq.pump(T0 + 1.01)
    assert list(fq.mail()) == ["b1"]  # a2 has the smaller tag but its own limit holds it
    assert pumped.depth == 1
    assert pumped.next_fit == pytest.approx(T0 + 60, abs=1e-5)  # a's bucket refills then


def test_it_parks_flows_held_by_their_own_limits_so_the_others_are_not_starved(fq):
    for i in range(40):  # forty tenants use their one request a minute...
        assert isinstance(fq.enter(f"x{i}", [tenant(f"t{i}", rpm=1), TPM], tokens(1)), Grant)
    fq.enter("z0", [tenant("z"), TPM], tokens(900))
    for i in range(40):  # ... and ask again: each waits for its own limit, not the pool's
        fq.enter(f"y{i}", [tenant(f"t{i}", rpm=1), TPM], tokens(1))
    # Their tags are the smallest, but they are parked: a pump need not look at them.
    assert isinstance(fq.enter("z1", [tenant("z"), TPM], tokens(10), now=T0 + 1), Grant)
    pumped = fq.pump(T0 + 2)
    assert (pumped.depth, pumped.next_fit) == (40, pytest.approx(T0 + 60, abs=1e-5))
    for _ in range(3):  # at most 16 grants per pump call
        fq.pump(T0 + 60.01)
    assert sorted(fq.mail()) == sorted(f"y{i}" for i in range(40))


def test_it_does_not_hold_an_app_back_behind_another_app_of_its_tenant_held_by_its_own_limit(fq):
    bulk, acme = app("bulk", rpm=1), tenant("acme")
    assert isinstance(fq.enter("b1", [bulk, acme, TPM], tokens(10), flow="acme"), Grant)
    for i in range(2, 5):  # bulk's own limit holds these for a minute...
        assert isinstance(fq.enter(f"b{i}", [bulk, acme, TPM], tokens(10), flow="acme"), Queued)
    # ... but not the indexer, its tenant's other app (same flow): the pool has room.
    indexer = fq.enter("i1", [app("indexer"), acme, TPM], tokens(10), flow="acme", now=T0 + 1)
    assert isinstance(indexer, Grant) and indexer.created_at == T0 + 1
    pumped = fq.pump(T0 + 2)
    assert (pumped.depth, pumped.next_fit) == (3, pytest.approx(T0 + 60, abs=1e-5))
    fq.pump(T0 + 60.01)
    assert list(fq.mail()) == ["b2"]  # bulk's next, once its own limit lets it


def test_it_takes_turns_among_the_apps_of_a_tenant(fq):
    fq.enter("b0", [tenant("b"), TPM], tokens(1000))  # the pool is empty; 100 tokens/s
    acme = tenant("acme")
    for rid in ("x1", "x2", "x3", "y1", "y2", "z1"):
        queued = fq.enter(rid, [app(rid[0]), acme, TPM], tokens(100), flow="acme")
        assert isinstance(queued, Queued)
    order = []
    for t in range(1, 8):
        fq.pump(T0 + t + 0.001)
        order += list(fq.mail())
    # Round robin among the tenant's apps, each app's requests in the order they came.
    assert order == ["x1", "y1", "z1", "x2", "y2", "x3"]


def test_it_evicts_the_newest_waiter_of_the_busiest_app_when_the_queue_is_full(fq):
    fq.enter("b0", [tenant("b"), TPM], tokens(1000))
    acme = tenant("acme")
    for rid in ("x1", "x2", "x3", "y1"):
        assert isinstance(
            fq.enter(rid, [app(rid[0]), acme, TPM], tokens(100), flow="acme", max_depth=5), Queued
        )
    assert isinstance(fq.enter("c1", [tenant("c"), TPM], tokens(100), max_depth=5), Queued)
    # Full: a quiet tenant's newcomer evicts from the longest flow's busiest app, not its
    # quieter app's one request that came last.
    assert isinstance(fq.enter("d1", [tenant("d"), TPM], tokens(100), max_depth=5), Queued)
    evicted = fq.mail()
    assert list(evicted) == ["x3"] and evicted["x3"].reason is QueueReason.QUEUE_FULL
    # A flow's depth counts the waiters of all its apps.
    full = fq.enter("w1", [app("w"), acme, TPM], tokens(100), flow="acme", flow_depth=3)
    assert isinstance(full, QueueRefusal) and full.reason is QueueReason.FLOW_FULL


def test_it_keeps_others_from_starving_a_large_request_on_a_shared_bucket(fq):
    route = BucketSpec("route-tpm", "model:7", Dimension.TOTAL_TOKENS, Rule.REFILL, 1000, 10)
    big = BucketSpec("alpha-big", POOL, Dimension.TOTAL_TOKENS, Rule.REFILL, 10000, 10)
    fq.enter("b0", [tenant("b"), big], tokens(1000), now=T0 - 20)
    fq.enter("a0", [tenant("a"), route, big], tokens(900))
    assert isinstance(fq.enter("a1", [tenant("a"), route, big], tokens(600)), Queued)
    # b has had more than a: a1 goes before b1. The route (not the pool) refuses a1, and b1,
    # which needs the same route, must not take its refill first; c1 does not use it and goes.
    assert isinstance(fq.enter("b1", [tenant("b"), route, big], tokens(100), now=T0 + 0.5), Queued)
    assert isinstance(fq.enter("c1", [tenant("c"), big], tokens(100), now=T0 + 0.5), Grant)
    fq.pump(T0 + 2)
    assert fq.mail() == {}
    fq.pump(T0 + 5.01)
    assert list(fq.mail()) == ["a1"]


def test_it_lets_a_waiter_leave_at_its_deadline_and_never_grants_after_it(fq):
    fq.enter("r1", [tenant("a"), TPM], tokens(1000))
    fq.enter("r2", [tenant("a"), TPM], tokens(100), deadline=T0 + 5)
    fq.enter("r3", [tenant("b"), TPM], tokens(100), deadline=T0 + 5)
    left = fq.q.leave(POOL, "r2", reason=QueueReason.DEADLINE, now=T0 + 0.5)
    assert isinstance(left, QueueRefusal)
    assert (left.reason, left.queue_id, left.bucket) == (QueueReason.DEADLINE, "r2", "")
    assert left.retry_at == pytest.approx(T0 + 1, abs=1e-5)  # the pool's next fit
    # r3's process is gone: at its deadline the pump drops it instead of granting it.
    pumped = fq.pump(T0 + 5)
    assert (pumped.granted, pumped.depth) == (0, 0)
    got = fq.mail()
    assert got["r3"].reason is QueueReason.DEADLINE
    assert fq.store.levels([TPM], now=T0 + 5)[0].available == 500  # nothing taken


def test_it_hands_a_waiter_the_grant_the_pump_made_in_the_same_instant(fq):
    fq.enter("r1", [tenant("a"), TPM], tokens(1000))
    fq.enter("r2", [tenant("a"), TPM], tokens(100), deadline=T0 + 5)
    fq.pump(T0 + 1.5)
    left = fq.q.leave(POOL, "r2", reason=QueueReason.DEADLINE, now=T0 + 1.5)
    assert isinstance(left, Grant) and left.created_at == T0 + 1.5  # it owns the grant
    assert fq.q.leave(POOL, "r2", reason=QueueReason.DEADLINE, now=T0 + 1.6) is None


def test_it_refuses_early_when_the_next_fit_is_past_the_deadline(fq):
    fq.enter("r1", [tenant("a"), TPM], tokens(1000))
    refusal = fq.enter("r2", [tenant("a"), TPM], tokens(500), deadline=T0 + 2)
    assert isinstance(refusal, QueueRefusal)
    assert (refusal.reason, refusal.bucket) == (QueueReason.DEADLINE_UNREACHABLE, "alpha-tpm")
    assert refusal.retry_at == pytest.approx(T0 + 5, abs=1e-5)
    # Behind a head that needs 5 s, a waiter with 3 s left is told at once too.
    fq.enter("r3", [tenant("b"), TPM], tokens(500), deadline=T0 + 100)
    doomed = fq.enter("r4", [tenant("c"), TPM], tokens(10), deadline=T0 + 3, now=T0 + 0.5)
    assert isinstance(doomed, QueueRefusal)
    assert (doomed.reason, doomed.queue_id) == (QueueReason.DEADLINE_UNREACHABLE, "r4")


def test_it_refuses_at_once_whom_its_own_flow_ahead_keeps_from_fitting_before_its_deadline(fq):
    fq.enter("r1", [tenant("a"), ITPM], tokens(1000))  # the pool is empty; 100 tokens/s
    assert isinstance(fq.enter("r2", [tenant("a"), ITPM], tokens(500)), Queued)  # fits at 5 s
    # Alone, 500 tokens would fit at 5 s; behind r2 in its own line, not before 10 s.
    refusal = fq.enter("r3", [tenant("a"), ITPM], tokens(500), deadline=T0 + 8)
    assert isinstance(refusal, QueueRefusal)
    assert (refusal.reason, refusal.bucket) == (QueueReason.DEADLINE_UNREACHABLE, "alpha-itpm")
    assert refusal.retry_at == pytest.approx(T0 + 10)
    assert refusal.queue_id == "r3"
    # Another tenant's line may be served before r2 (fair queuing): it waits.
    assert isinstance(fq.enter("r4", [tenant("b"), ITPM], tokens(500), deadline=T0 + 8), Queued)
    # With time enough behind r2, it waits too.
    assert isinstance(fq.enter("r5", [tenant("a"), ITPM], tokens(500), deadline=T0 + 11), Queued)
    assert fq.pump(T0 + 5.1).granted == 1


def test_it_does_not_foresee_the_drain_of_a_total_token_bucket(fq):
    # Total tokens include the output, mostly given back at settlement: a queue there may
    # drain much sooner than its refill says, so the waiter is left to its deadline.
    fq.enter("r1", [tenant("a"), TPM], tokens(1000))
    fq.enter("r2", [tenant("a"), TPM], tokens(500))
    assert isinstance(fq.enter("r3", [tenant("a"), TPM], tokens(500), deadline=T0 + 8), Queued)


def test_it_bounds_each_flow_and_evicts_from_the_longest_when_the_queue_is_full(fq):
    fq.enter("a0", [tenant("a"), TPM], tokens(1000))
    for i in range(1, 4):
        assert isinstance(fq.enter(f"a{i}", [tenant("a"), TPM], tokens(100), max_depth=4), Queued)
    full = fq.enter("a4", [tenant("a"), TPM], tokens(100), flow_depth=3)
    assert isinstance(full, QueueRefusal) and full.reason is QueueReason.FLOW_FULL
    assert isinstance(fq.enter("b1", [tenant("b"), TPM], tokens(100), max_depth=4), Queued)
    # Full (4 waiting): a quiet tenant's newcomer evicts a's newest waiter, not itself.
    assert isinstance(fq.enter("c1", [tenant("c"), TPM], tokens(100), max_depth=4), Queued)
    evicted = fq.mail()
    assert list(evicted) == ["a3"] and evicted["a3"].reason is QueueReason.QUEUE_FULL
    # The longest flow's own newcomer is the one refused.
    refused = fq.enter("a5", [tenant("a"), TPM], tokens(100), max_depth=4)
    assert isinstance(refused, QueueRefusal) and refused.reason is QueueReason.QUEUE_FULL
    assert fq.pump(T0).depth == 4


def test_it_wakes_a_waiter_of_a_concurrency_pool_on_release(fq):
    held = [fq.enter(f"r{i}", [tenant("a"), SLOTS], Usage()) for i in range(2)]
    queued = fq.enter("r2", [tenant("b"), SLOTS], Usage())
    assert isinstance(queued, Queued) and queued.next_fit == T0 + 30  # lease expiry, at worst
    result, pumped = fq.q.settle(held[0], None, pool=POOL, now=T0 + 1)
    assert (result.outcome, pumped.granted, pumped.depth) == ("released", 1, 0)
    assert fq.mail()["r2"].created_at == T0 + 1


def test_it_refuses_at_once_with_recovering_while_a_lost_state_is_relearnt(fq):
    fq.store.lose_state()  # Redis restarted empty: concurrency is unknown for a lease
    refusal = fq.enter("r1", [tenant("a"), SLOTS], Usage(), now=T0 + 1)
    assert isinstance(refusal, QueueRefusal)
    assert (refusal.reason, refusal.bucket, refusal.queue_id) == (
        Reason.RECOVERING,
        "alpha-conc",
        "",
    )
    assert refusal.retry_at == T0 + 1 + 30  # the learning period's own end, at the latest
    assert fq.pump(T0 + 1).depth == 0  # nobody left waiting to a deadline


def test_it_queues_for_a_paused_pool_until_the_pause_end_if_the_deadline_allows(fq):
    fq.store.pause(POOL, T0 + 20, now=T0)
    waiting = fq.enter("r1", [tenant("a"), TPM], tokens(10), deadline=T0 + 30)
    assert isinstance(waiting, Queued) and waiting.next_fit == T0 + 20
    late = fq.enter("r2", [tenant("b"), TPM], tokens(10), deadline=T0 + 10)
    assert isinstance(late, QueueRefusal)
    assert (late.reason, late.retry_at) == (QueueReason.DEADLINE_UNREACHABLE, T0 + 20)
    assert fq.pump(T0 + 19.9).granted == 0
    assert fq.pump(T0 + 20).granted == 1


def test_it_gives_a_cancelled_waiter_nothing_and_leaves_nothing_behind(fq):
    fq.enter("r1", [tenant("a"), TPM], tokens(1000))
    fq.enter("r2", [tenant("a"), TPM], tokens(300))
    fq.enter("r3", [tenant("b"), TPM], tokens(100))
    left = fq.q.leave(POOL, "r2", reason=QueueReason.CANCELLED, now=T0 + 1)
    assert left.reason is QueueReason.CANCELLED and left.retry_at == T0 + 1
    fq.pump(T0 + 1.01)  # r2 was the head: r3 goes now
    assert list(fq.mail()) == ["r3"]
    assert fq.pump(T0 + 2).depth == 0


def test_it_tries_a_request_that_may_not_wait_once_and_refuses_it_if_not_its_turn(fq):
    fq.enter("r1", [tenant("a"), TPM], tokens(1000))
    fq.enter("r2", [tenant("a"), TPM], tokens(100))
    refused = fq.enter("i1", [tenant("b"), TPM], tokens(100), max_depth=0)
    assert isinstance(refused, QueueRefusal) and refused.reason is QueueReason.QUEUE_FULL
    assert isinstance(
        fq.enter("i2", [tenant("b"), TPM], tokens(100), max_depth=0, now=T0 + 3), Grant
    )
    assert list(fq.mail()) == ["r2"]  # after i2, in the same pump


def test_it_drops_the_waiter_of_a_process_that_stopped_reading_and_serves_the_next(fq):
    fq.enter("r1", [tenant("a"), TPM], tokens(1000))  # the pool is empty; 100 tokens/s
    # The other process's waiter is first in line (same tag, smaller id); then it dies.
    assert isinstance(fq.enter("d1", [tenant("d"), TPM], tokens(500), via=fq.other), Queued)
    assert isinstance(fq.enter("l1", [tenant("l"), TPM], tokens(500), now=T0 + 0.1), Queued)
    # 500 tokens fit at T0 + 5, when d1's mark (set as it joined) has run out.
    pumped = fq.pump(T0 + 5.01)
    assert (pumped.granted, pumped.refused, pumped.depth) == (1, 1, 0)
    got = fq.mail()
    assert list(got) == ["l1"] and got["l1"].created_at == T0 + 5.01
    assert fq.store.levels([TPM], now=T0 + 5.01)[0].available == pytest.approx(1, abs=1e-6)
    # What the dead process would read, or learn by leaving: it left, taking nothing.
    told = fq.mail(via=fq.other)["d1"]
    assert (told.reason, told.queue_id, told.retry_at) == (QueueReason.ABANDONED, "d1", T0 + 5.01)
    left = fq.other.leave(POOL, "d1", reason=QueueReason.CANCELLED, now=T0 + 6)
    assert left.reason is QueueReason.ABANDONED


def test_it_keeps_the_waiter_of_a_slow_reader_within_its_mark(fq):
    fq.enter("r1", [tenant("a"), TPM], tokens(1000))
    fq.enter("d1", [tenant("d"), TPM], tokens(500), via=fq.other)
    fq.enter("l1", [tenant("l"), TPM], tokens(500), now=T0 + 0.1)
    assert fq.other.mail(timeout=0, now=T0 + 3) == []  # it read at T0 + 3: alive until T0 + 8
    pumped = fq.pump(T0 + 7.99)
    assert (pumped.granted, pumped.refused, pumped.depth) == (1, 0, 1)
    assert list(fq.mail(via=fq.other)) == ["d1"]
    assert isinstance(fq.other.mail(timeout=0, now=T0 + 7.99), list)


def test_it_marks_mailboxes_alive_for_as_long_in_lua_as_in_the_core():
    lua = (LUA / "queue_lib.lua").read_text()
    found = re.search(r"^local ALIVE_SECONDS = ([0-9.]+)$", lua, re.M)
    assert found is not None and float(found.group(1)) == MAILBOX_ALIVE_SECONDS


# -- the Lua and the core decide the same ------------------------------------------------


def _lanes_beside_a_head(fq: Fixture) -> int:
    """(In the core) flows that have a head while another lane of theirs is parked."""
    pq = fq.q.store.queue.pools.get(POOL)
    if pq is None:
        return 0
    parked = {key.partition("\x1f")[0] for key in pq.parked}
    return sum(1 for name, flow in pq.flows.items() if name in parked and flow.ring)


def _scenario(
    fq: Fixture, seed: int, *, drain: bool = False, dies_at: int = -1, lanes: bool = False
) -> list[Any]:
    """Random steps; with ``drain``, mostly on the input-token pool, whose drain is foreseen.
    Two processes enter; from step ``dies_at`` on, the second reads, enters and leaves no more
    (killed), and what it was told is read at the end. With ``lanes``, each tenant has three
    apps with limits of their own (most requests come from one of them), so its flow has lanes.
    In the core, ``fq.beside`` counts the steps where a lane was parked beside a flow's head."""
    rng = random.Random(seed)
    rpms = [30, 1000, 1000] if lanes else [3, 30, 1000]  # with lanes: mostly the apps' limits
    tenants = {name: tenant(name, rpm=rng.choice(rpms)) for name in "abcd"}
    apps = {  # held for a few seconds at a time: less than most deadlines
        name: [app(f"{name}{k}", rpm=rng.choice([1, 2, 1000]), per=10) for k in range(3)]
        for name in ("abcd" if lanes else "")
    }
    now, log, grants = T0, [], []
    owners: dict[str, Any] = {}
    deadlines = [2.0, 6.0, 20.0] if drain else [6.0, 20.0, 20.0] if lanes else [0.5, 3.0, 20.0]
    sizes = [10, 100, 100, 400] if lanes else [10, 100, 100, 400, 900, 2000]
    for i in range(120):
        now += rng.choice([0.0, 0.05, 0.3, 1.0])
        if i == dies_at:  # its last act: a burst of waiters, then it is killed
            for k in range(8):
                name = rng.choice("abcd")
                fq.enter(
                    f"z{k}",
                    [tenants[name], rng.choice([TPM, SLOTS])],
                    tokens(rng.choice([100, 400, 900])),
                    flow=name,
                    deadline=now + 60,
                    flow_depth=8,
                    now=now,
                    via=fq.other,
                )
        alive = [fq.q] if 0 <= dies_at <= i else [fq.q, fq.other]
        via = alive[rng.randrange(2) % len(alive)]
        kind = rng.random()
        if kind < 0.55:
            name = rng.choice("ab" if lanes else "abcd")  # with lanes: longer flows
            if drain:
                pool = ITPM if rng.random() < 0.9 else TPM
            else:
                pool = rng.choice([TPM, SLOTS, ITPM]) if rng.random() < 0.4 else TPM
            buckets = [tenants[name], pool]
            if lanes and rng.random() < 0.8:
                buckets.insert(0, rng.choice(apps[name]))
            owners[f"r{i}"] = via
            result = fq.enter(
                f"r{i}",
                buckets,
                tokens(rng.choice(sizes)),
                flow=name,
                weight=rng.choice([1.0, 2.0, 8.0]),
                deadline=now + rng.choice(deadlines),
                max_depth=rng.choice([0, 6, 12]),
                flow_depth=rng.choice([4, 8] if drain or lanes else [2, 4]),
                burst=rng.choice([0.0, 500.0]),
                now=now,
                via=via,
            )
            log.append(result)
            if isinstance(result, Grant):
                grants.append(result)
        elif kind < 0.8:
            log.append(fq.pump(now))
        elif kind < 0.9 and grants:
            log.append(
                fq.q.settle(grants.pop(rng.randrange(len(grants))), None, pool=POOL, now=now)
            )
        else:
            rid = f"r{i - rng.randrange(1, 10)}"
            owner = owners.get(rid, fq.q)
            if owner in alive:  # only its own process cancels a waiter
                log.append(owner.leave(POOL, rid, reason=QueueReason.CANCELLED, now=now))
        fq.now = now
        for process in alive:  # each live process's listener reads
            mail = sorted(fq.mail(via=process).items())
            grants += [v for _, v in mail if isinstance(v, Grant)]
            log.append(mail)
        if lanes and fq.kind == "memory":
            fq.beside += _lanes_beside_a_head(fq)
    log.append(sorted(fq.mail(via=fq.other).items()))  # what the dead process was told
    return log


@pytest.mark.parametrize("drain", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_it_decides_the_same_in_lua_as_in_the_core(runner, seed, drain):
    memory, _ = make_fixture("memory", runner)
    on_redis, cleanup = make_fixture("redis", runner)
    try:
        assert _scenario(memory, seed, drain=drain) == _scenario(on_redis, seed, drain=drain)
    finally:
        cleanup()


@pytest.mark.parametrize("drain", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_it_decides_the_same_in_lua_as_in_the_core_with_a_tenants_apps_in_lanes(
    runner, seed, drain
):
    memory, _ = make_fixture("memory", runner)
    on_redis, cleanup = make_fixture("redis", runner)
    try:
        expected = _scenario(memory, seed, drain=drain, lanes=True)
        assert _scenario(on_redis, seed, drain=drain, lanes=True) == expected
    finally:
        cleanup()


def test_it_parks_apps_beside_a_siblings_turn_in_most_random_scenarios(runner):
    """The scenarios above do meet lanes parked beside their flow's head (in the core)."""
    seen = []
    for seed in range(12):
        for drain in (False, True):
            memory, _ = make_fixture("memory", runner)
            _scenario(memory, seed, drain=drain, lanes=True)
            seen.append(memory.beside > 0)
    assert sum(seen) >= len(seen) // 2, seen


def _abandoned(log: list[Any]) -> int:
    told = [v for step in log if isinstance(step, list) for _, v in step]
    return sum(isinstance(v, QueueRefusal) and v.reason is QueueReason.ABANDONED for v in told)


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_it_drops_a_dead_processs_waiters_the_same_in_lua_as_in_the_core(runner, seed, lanes):
    memory, _ = make_fixture("memory", runner)
    on_redis, cleanup = make_fixture("redis", runner)
    try:
        expected = _scenario(memory, seed, dies_at=40, lanes=lanes)
        assert _scenario(on_redis, seed, dies_at=40, lanes=lanes) == expected
        assert _abandoned(expected) > 0  # the pump did meet the dead process's waiters
    finally:
        cleanup()
