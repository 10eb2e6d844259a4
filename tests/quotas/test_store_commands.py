"""What the Lua costs Redis per bucket (issue 19): each bucket's state is read with one command
and written with one (a GET and a SET of its packed string, or an HMGET and an HSET of its
hash); a concurrency bucket sweeps its holders for run-out leases only once one
can have run out (its 'nx'), and that sweep still frees every run-out lease on time. On a
private redis-server, so command counts are the store's alone."""

from __future__ import annotations

import redis
import redis.asyncio

from quotas.core.model import BucketSpec, Dimension, Grant, Outcome, Refusal, Rule, Usage, Window
from quotas.store.redis import RedisReservationStore

SCOPE = "provider:c"
SLOTS = BucketSpec("c-slots", SCOPE, Dimension.CONCURRENCY, Rule.CONCURRENCY, 2)
BUCKETS = [
    BucketSpec("c-rpm", SCOPE, Dimension.REQUESTS, Rule.REFILL, 1000, 60),
    BucketSpec("c-day", SCOPE, Dimension.TOTAL_TOKENS, Rule.FIXED_WINDOW, 1e9, window=Window.DAY),
    BucketSpec("c-spend", "tenant:c", Dimension.SPEND, Rule.ROLLING_WINDOW, 100.0, 3600),
    BucketSpec("c-conc", SCOPE, Dimension.CONCURRENCY, Rule.CONCURRENCY, 100),
]
DEMAND = Usage(input_tokens=100, output_tokens=100, spend=0.01, concurrency=1)
ACTUAL = Usage(input_tokens=120, output_tokens=50, spend=0.02)
T = 1_000_000.0


def store_on(url: str) -> RedisReservationStore:
    return RedisReservationStore(redis.asyncio.Redis.from_url(url), prefix="cmd")


def calls(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}


def test_it_reads_and_writes_each_bucket_once_in_reserve_and_in_reconcile(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    warm = runner.run(store.reserve("warm", BUCKETS, DEMAND, now=T))
    assert isinstance(warm, Grant)
    runner.run(store.reconcile(warm, ACTUAL, now=T + 1))

    admin.config_resetstat()
    grant = runner.run(store.reserve("r", BUCKETS, DEMAND, now=T + 2))
    assert isinstance(grant, Grant)
    reserved = calls(admin)
    admin.config_resetstat()
    assert runner.run(store.reconcile(grant, ACTUAL, now=T + 3)).outcome is Outcome.RECONCILED
    settled = calls(admin)

    # reserve: the epoch one HMGET; a packed bucket (refill, fixed window) one GET and one SET,
    # a hash bucket (rolling window, concurrency) one HMGET and one HSET; the lease record one
    # GET (a replay?) and one SET; the holder's ZADD
    assert reserved["hmget"] == 1 + 2 and reserved["hset"] == 2
    assert reserved["get"] == 2 + 1 and reserved["set"] == 2 + 1
    assert "hget" not in reserved and "zrangebyscore" not in reserved
    # reconcile: the requests bucket is left alone (actual = estimate); the holder is released
    assert settled["hmget"] == 1 + 2 and settled["hset"] == 2
    # the fixed window's GET and SET, the lease record's GET and its rewrite (a SET, or a
    # SETRANGE of its state where the record is packed)
    assert settled["get"] == 1 + 1
    assert settled.get("set", 0) + settled.get("setrange", 0) == 1 + 1
    assert "hget" not in settled and "zrangebyscore" not in settled
    runner.run(store.client.aclose())


def test_a_run_out_lease_still_frees_its_slot_when_it_runs_out(redis_server, runner):
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())

    def reserve(rid: str, now: float, lease: float) -> Grant | Refusal:
        return runner.run(
            store.reserve(rid, [SLOTS], Usage(concurrency=1), now=now, lease_seconds=lease)
        )

    def available(now: float) -> float:
        return runner.run(store.levels([SLOTS], now=now))[0].available

    assert isinstance(reserve("a", T, 10), Grant)
    assert isinstance(reserve("b", T, 100), Grant)
    assert isinstance(reserve("c", T + 5, 5), Refusal)  # full: nothing has run out yet
    assert isinstance(reserve("c", T + 10.5, 5), Grant)  # a ran out at T + 10
    assert available(T + 12) == 0  # b and c
    assert available(T + 15.5) == 1  # c (a later lease than the earliest left) ran out
    assert available(T + 100.5) == 2  # and b
    runner.run(store.client.aclose())
