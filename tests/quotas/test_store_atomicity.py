"""The Redis store under real concurrency: many OS processes × many asyncio reservations on
shared buckets, a holder killed with SIGKILL, Redis losing its state under load, and the same
reservation id sent concurrently. Bounded in time (a few seconds each)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
import redis
import redis.asyncio

from quotas.core.keys import epoch_key
from quotas.core.model import Grant, Outcome, Refusal, Usage
from quotas.store.redis import RedisReservationStore
from tests.quotas import loadgen
from tests.quotas.conftest import REDIS_URL, unique_prefix

pytestmark = pytest.mark.slow
SPAWN = multiprocessing.get_context("spawn")


def store_for(runner, url, prefix, **options):
    return RedisReservationStore(redis.asyncio.Redis.from_url(url), prefix=prefix, **options)


def test_it_admits_exactly_capacity_from_eight_processes_at_once(prefix, runner):
    with SPAWN.Pool(8) as pool:
        results = pool.starmap(loadgen.burst_worker, [(REDIS_URL, prefix, "", 40)] * 8)
    outcomes = [kind for worker in results for kind, _ in worker]
    assert len(outcomes) == 320
    assert outcomes.count("G") == loadgen.CONC.capacity  # exactly 10 of 320


def test_it_never_exceeds_capacity_and_loses_nothing_under_mixed_load(prefix, runner):
    with SPAWN.Pool(8) as pool:
        seen = pool.starmap(
            loadgen.mixed_worker, [(REDIS_URL, prefix, 3.0, 30, seed) for seed in range(8)]
        )
    intervals = [i for s in seen for i in s.intervals]
    granted = sum(s.granted for s in seen)
    assert granted > 150, "the load did not get going"
    assert sum(s.reasons.get("bucket_exhausted", 0) for s in seen) > 1000
    assert loadgen.peak(intervals) == loadgen.CONC.capacity  # saturated, never above
    # The request bucket (no refill to speak of) is exhausted during the run, and the net
    # number of requests taken never exceeds its capacity at any instant.
    takes = [t for s in seen for t in s.grants_at]
    gives = [t for s in seen for t in s.releases_at]
    assert loadgen.most_in_use(takes, gives) == loadgen.RPM.capacity
    # Once every lease is reconciled, released or expired, nothing is lost or created.
    store = store_for(runner, REDIS_URL, prefix)
    settle_after = max(end for _, end in intervals) + 0.01
    while time.time() < settle_after:
        time.sleep(0.05)
    runner.run(store.reap(limit=10_000))
    conc, day, spend, rpm = runner.run(store.levels(loadgen.MIXED))
    assert conc.available == loadgen.CONC.capacity
    assert day.available == loadgen.DAY.capacity - sum(s.charged_tokens for s in seen)
    assert spend.available == pytest.approx(
        loadgen.SPEND.capacity - sum(s.charged_spend for s in seen), abs=1e-6
    )
    in_use = granted - sum(s.released_requests for s in seen)
    refill = loadgen.RPM.capacity * 10 / loadgen.RPM.period  # at most 10 s of refill
    assert loadgen.RPM.capacity - in_use <= rpm.available <= loadgen.RPM.capacity - in_use + refill
    runner.run(store.client.aclose())


def test_it_takes_once_for_one_reservation_id_sent_concurrently(prefix, runner):
    with SPAWN.Pool(4) as pool:
        results = pool.starmap(loadgen.burst_worker, [(REDIS_URL, prefix, "same-id", 25)] * 4)
    rows = [row for worker in results for row in worker]
    assert {kind for kind, _ in rows} == {"G"}
    assert len({created for _, created in rows}) == 1  # the same grant, 100 times
    store = store_for(runner, REDIS_URL, prefix)
    conc, rpm = runner.run(store.levels([loadgen.CONC, loadgen.RPM]))
    assert conc.available == loadgen.CONC.capacity - 1
    assert rpm.available == pytest.approx(loadgen.RPM.capacity - 1, abs=0.01)
    runner.run(store.client.aclose())


def test_it_gets_a_killed_holders_capacity_back_within_the_lease(prefix, runner, tmp_path):
    ready = tmp_path / "ready"
    child = SPAWN.Process(target=loadgen.hold_and_hang, args=(REDIS_URL, prefix, 10, str(ready)))
    child.start()
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert time.monotonic() < deadline and child.is_alive()
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.join(5)
        killed_at = time.time()
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
    store = store_for(runner, REDIS_URL, prefix, lease_seconds=1.0)
    refusal = runner.run(store.reserve("after-kill", [loadgen.CONC], Usage()))
    assert isinstance(refusal, Refusal) and refusal.reason == "bucket_exhausted"
    assert refusal.retry_at <= killed_at + 1.0 + 0.5
    time.sleep(max(0.0, refusal.retry_at - time.time()) + 0.02)
    grants = [runner.run(store.reserve(f"new-{n}", [loadgen.CONC], Usage())) for n in range(11)]
    assert [isinstance(g, Grant) for g in grants] == [True] * 10 + [False]
    assert len(runner.run(store.reap())) == 10  # the dead leases, marked expired for the ledger
    assert runner.run(store.levels([loadgen.CONC]))[0].available == 0  # nothing given twice
    runner.run(store.client.aclose())


def test_it_survives_flushall_and_function_flush_under_load_within_capacity(redis_server, runner):
    prefix = unique_prefix()
    admin = redis.Redis(port=redis_server.port)
    admin.hset(f"{prefix}:epoch", mapping={"born": "0", "until": "0"})
    with SPAWN.Manager() as manager, SPAWN.Pool(4) as pool:
        ready = manager.Queue()
        pending = pool.starmap_async(
            loadgen.churn_worker,
            [(redis_server.url, prefix, 2.0, 20, seed, ready) for seed in range(4)],
        )
        for _ in range(4):  # every worker is up (spawned) and holds a grant
            ready.get(timeout=30)
        time.sleep(0.3)  # and its streams are renewing
        seconds, micros = admin.time()
        before_flush = seconds + micros / 1e6
        admin.flushall()
        admin.function_flush()  # the scripts' library too, as a restart without persistence
        seen = pending.get(timeout=60)
    # The first script call after the flush found no epoch and began the learning period. The
    # epoch hash says when, in Redis's clock: reading our own clock after the flush instead
    # would be late by however long this process was descheduled on a loaded machine.
    born, learning_until = (float(v) for v in admin.hmget(epoch_key(prefix), "born", "until"))
    errors = [e for s in seen for e in s.errors]
    assert errors == []  # no 'Function not found', no script error, nothing
    assert sum(s.reasons.get("recovering", 0) for s in seen) > 0
    assert sum(s.adopted for s in seen) > 0  # streams in flight were re-registered
    intervals = [i for s in seen for i in s.intervals]
    assert loadgen.peak(intervals) <= loadgen.CONC.capacity  # in-flight ones counted
    assert born >= before_flush and learning_until >= born + 1.0  # one lease at least
    after = [start for start, _ in intervals if start >= born]
    assert after, "nothing was admitted after the learning period"
    assert min(after) >= learning_until  # nothing new while it learned
    admin.close()


def test_it_answers_the_first_call_after_a_real_redis_restart(redis_server, runner):
    prefix = unique_prefix()
    store = store_for(runner, redis_server.url, prefix, lease_seconds=1.0)
    runner.run(store.bootstrap())
    grant = runner.run(store.reserve("before", [loadgen.CONC, loadgen.FAST_RPM], Usage()))
    assert isinstance(grant, Grant)
    redis_server.stop()
    redis_server.start()  # same port, empty: no data, no scripts
    refusal = runner.run(store.reserve("after", [loadgen.CONC, loadgen.FAST_RPM], Usage()))
    assert isinstance(refusal, Refusal) and refusal.reason == "recovering"
    assert runner.run(store.release(grant)).outcome is Outcome.UNKNOWN
    time.sleep(1.05)
    assert isinstance(runner.run(store.reserve("later", [loadgen.CONC], Usage())), Grant)
    runner.run(store.client.aclose())
