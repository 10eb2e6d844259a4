"""The store's scripts as one Redis function library (quotas/store/library.py): loaded once,
called with FCALL; a Redis that lost it (restarted without persistence, FUNCTION FLUSH) gets
it again on the next call, which then happens exactly once. On a private redis-server."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from redis.exceptions import ResponseError

from quotas.core.model import BucketSpec, Dimension, Grant, Outcome, Reason, Rule, Usage, Window
from quotas.queue import BrokerQueue
from quotas.store.library import ENTRIES, library_code
from quotas.store.queue_redis import RedisQueueStore
from quotas.store.redis import RedisReservationStore

POOL = "provider:p"
RPM = BucketSpec("p-rpm", POOL, Dimension.REQUESTS, Rule.REFILL, 100, 60)
SLOTS = BucketSpec("p-slots", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 5)
BUCKETS = [RPM, SLOTS]
DEMAND = Usage(input_tokens=300, output_tokens=200)


def store_on(url: str) -> RedisReservationStore:
    return RedisReservationStore(redis.asyncio.Redis.from_url(url), prefix="lib")


def pairs(flat: list) -> dict:
    """A RESP2 map (FUNCTION LIST's): [key, value, key, value, ...]."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def rpm_state_broken(admin: redis.Redis) -> None:
    """The refill bucket's state, a string, replaced by a hash: its next use is a WRONGTYPE."""
    [key] = [k for k in admin.scan_iter(match="lib:*") if b"p-rpm" in k]
    admin.delete(key)
    admin.hset(key, "not", "a packed string")


def calls(admin: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in admin.info("commandstats").items()}


def test_it_registers_every_entry_script_under_a_name_with_the_library_digest(redis_server):
    admin = redis.Redis(port=redis_server.port)
    digest, source = library_code()
    admin.function_load(source)
    [library] = admin.function_list(library=f"switchyard_{digest}")
    functions = pairs(library)[b"functions"]
    names = {pairs(f)[b"name"].decode() for f in functions}
    assert names == {f"{entry}_{digest}" for entry in ENTRIES}


def test_it_loads_the_library_once_and_runs_every_call_with_fcall(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    assert runner.run(store.scripts_load()) == 1  # a new Redis lacks it
    assert runner.run(store.scripts_load()) == 0
    runner.run(store.bootstrap())
    admin.config_resetstat()
    for n in range(3):
        grant = runner.run(store.reserve(f"r{n}", BUCKETS, DEMAND))
        assert isinstance(grant, Grant)
        assert runner.run(store.release(grant)).outcome is Outcome.RELEASED
    seen = calls(admin)
    assert seen["fcall"] == 6
    assert "evalsha" not in seen and "eval" not in seen and "function|load" not in seen
    runner.run(store.client.aclose())


def test_a_lost_library_is_loaded_again_and_the_call_happens_once(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    queue = BrokerQueue(RedisQueueStore(store))
    runner.run(store.bootstrap())
    first = runner.run(store.reserve("a", BUCKETS, DEMAND))
    assert isinstance(first, Grant)
    admin.function_flush()
    admin.config_resetstat()
    second = runner.run(store.reserve("b", BUCKETS, DEMAND))
    assert isinstance(second, Grant)
    assert calls(admin)["function|load"] == 1
    [slots] = runner.run(store.levels([SLOTS]))
    assert slots.available == SLOTS.capacity - 2  # each grant holds one slot: none twice
    admin.function_flush()  # the fair queue's functions are in the same library
    admit = queue.admit(
        "q", BUCKETS, DEMAND, pool=POOL, flow="t", weight=1.0,
        deadline=store.local_now() + 5, max_depth=10, flow_depth=10,
    )  # fmt: skip
    grant = runner.run(admit)
    assert isinstance(grant, Grant)
    assert runner.run(queue.reconcile(grant, DEMAND)).outcome is Outcome.RECONCILED
    runner.run(queue.close())
    runner.run(store.client.aclose())


def test_a_script_error_is_raised_not_taken_for_a_lost_library(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    grant = runner.run(store.reserve("a", [RPM], DEMAND))
    assert isinstance(grant, Grant)
    rpm_state_broken(admin)
    admin.config_resetstat()
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        runner.run(store.reserve("b", [RPM], DEMAND))
    assert "function|load" not in calls(admin)
    runner.run(store.client.aclose())


def test_calls_that_come_while_one_is_on_its_way_go_together_as_if_one_by_one(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    admin.config_resetstat()

    async def eight_at_once():
        return await asyncio.gather(*(store.reserve(f"r{n}", BUCKETS, DEMAND) for n in range(8)))

    verdicts = runner.run(eight_at_once())
    # The first went alone; the seven that came meanwhile in one batch: two FCALLs, not eight.
    assert calls(admin)["fcall"] == 2
    # Five slots: the first five in order were granted, the rest refused, as one by one.
    assert [isinstance(v, Grant) for v in verdicts] == [True] * 5 + [False] * 3
    refused = {(v.reason, v.bucket) for v in verdicts[5:]}
    assert refused == {(Reason.BUCKET_EXHAUSTED, "p-slots")}
    [slots] = runner.run(store.levels([SLOTS]))
    assert slots.available == 0

    async def release_all():
        return await asyncio.gather(*(store.release(g) for g in verdicts[:5]))

    runner.run(release_all())
    [slots] = runner.run(store.levels([SLOTS]))
    assert slots.available == SLOTS.capacity
    runner.run(store.client.aclose())


def test_a_call_that_fails_in_a_batch_fails_alone(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    first = runner.run(store.reserve("a", [RPM], DEMAND))
    rpm_state_broken(admin)

    async def together():
        return await asyncio.gather(
            store.release(first),  # on its way: the next three wait and go as one batch
            store.reserve("b", [SLOTS], DEMAND),
            store.reserve("c", [RPM], DEMAND),  # WRONGTYPE
            store.reserve("d", [SLOTS], DEMAND),
            return_exceptions=True,
        )

    admin.config_resetstat()
    released, b, c, d = runner.run(together())
    assert calls(admin)["fcall"] == 2
    assert isinstance(b, Grant) and isinstance(d, Grant)
    assert isinstance(c, ResponseError) and "WRONGTYPE" in str(c)
    assert isinstance(released, ResponseError)  # the release reads the broken bucket too
    [slots] = runner.run(store.levels([SLOTS]))
    assert slots.available == SLOTS.capacity - 2
    runner.run(store.client.aclose())


def test_a_caller_that_leaves_while_waiting_is_not_sent(redis_server, runner):
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())

    async def scenario():
        on_its_way = asyncio.ensure_future(store.reserve("a", BUCKETS, DEMAND))
        await asyncio.sleep(0)  # "a" is sent; "b" waits for it
        waiting = asyncio.ensure_future(store.reserve("b", BUCKETS, DEMAND))
        await asyncio.sleep(0)
        waiting.cancel()
        return await on_its_way, await asyncio.gather(waiting, return_exceptions=True)

    grant, [left] = runner.run(scenario())
    assert isinstance(grant, Grant)
    assert isinstance(left, asyncio.CancelledError)
    [slots] = runner.run(store.levels([SLOTS]))
    assert slots.available == SLOTS.capacity - 1  # "b" holds nothing
    runner.run(store.client.aclose())


def test_a_batch_to_a_redis_that_lost_the_library_loads_it_and_runs_once(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())

    async def scenario():
        first = asyncio.ensure_future(store.reserve("a", BUCKETS, DEMAND))
        await asyncio.sleep(0)
        admin.function_flush()  # "a" found it; the batch that follows will not
        rest = [store.reserve(f"r{n}", BUCKETS, DEMAND) for n in range(3)]
        return [await first, *await asyncio.gather(*rest)]

    admin.config_resetstat()
    grants = runner.run(scenario())
    assert all(isinstance(g, Grant) for g in grants)
    assert calls(admin)["function|load"] == 1
    [slots] = runner.run(store.levels([SLOTS]))
    assert slots.available == SLOTS.capacity - 4  # each call took its slot once
    runner.run(store.client.aclose())


def test_a_batch_leaves_every_bucket_state_it_wrote_with_a_ttl(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    day = BucketSpec("p-day", POOL, Dimension.REQUESTS, Rule.FIXED_WINDOW, 1000, window=Window.DAY)
    ramp = BucketSpec("p-ramp", POOL, Dimension.REQUESTS, Rule.RAMP, 100, period=60, factor=2)
    buckets = [RPM, day, ramp, SLOTS]

    async def together():
        return await asyncio.gather(*(store.reserve(f"r{n}", buckets, DEMAND) for n in range(4)))

    grants = runner.run(together())  # new keys, written first in a batch (PX), then KEEPTTL
    assert all(isinstance(g, Grant) for g in grants)
    states = list(admin.scan_iter(match="lib:*:bp:*"))
    assert len(states) == 3
    assert all(admin.pttl(key) > 0 for key in states)
    [rpm, day_level, ramp_level] = runner.run(store.levels([RPM, day, ramp]))
    assert rpm.available == pytest.approx(96, abs=0.5)  # refilling since (the real clock)
    assert (day_level.available, ramp_level.available) == (996, 96)
    runner.run(store.client.aclose())


def test_callers_of_a_batch_that_is_cancelled_are_cancelled_not_left_waiting(redis_server, runner):
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    library = store.library
    send, on_its_way = library._batch, asyncio.Event()

    async def never_back(batch):
        on_its_way.set()
        await asyncio.Event().wait()  # a batch whose reply never comes

    library._batch = never_back

    async def scenario():
        first = asyncio.ensure_future(store.reserve("a", BUCKETS, DEMAND))
        await asyncio.sleep(0)
        batched = [asyncio.ensure_future(store.reserve(n, BUCKETS, DEMAND)) for n in "bc"]
        await on_its_way.wait()  # "a" is back; "b" and "c" went as a batch
        later = asyncio.ensure_future(store.reserve("d", BUCKETS, DEMAND))
        await asyncio.sleep(0)  # "d" waits for the batch
        [sender] = library._sending
        sender.cancel()  # as when the loop closes
        outcomes = await asyncio.wait_for(
            asyncio.gather(*batched, later, return_exceptions=True), timeout=5
        )
        return await first, outcomes

    grant, outcomes = runner.run(scenario())
    assert isinstance(grant, Grant)
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    library._batch = send
    assert not library._busy  # the next call goes at once
    assert isinstance(runner.run(store.reserve("e", BUCKETS, DEMAND)), Grant)
    runner.run(store.client.aclose())
