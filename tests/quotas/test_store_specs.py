"""Spec sets (quotas/store/redis.py): a request's bucket definitions go to Redis once and the
hot scripts read them by key. When Redis loses them (flushed, restarted, a TTL ran out) the
script changes nothing and answers "unknown spec"; the store sends the definition again and
the call happens exactly once. On a private redis-server, which these tests flush."""

from __future__ import annotations

import redis
import redis.asyncio

from quotas.core.model import BucketSpec, Dimension, Grant, Outcome, Rule, Usage
from quotas.queue import BrokerQueue
from quotas.store.queue_redis import RedisQueueStore
from quotas.store.redis import RedisReservationStore

POOL = "provider:p"
RPM = BucketSpec("p-rpm", POOL, Dimension.REQUESTS, Rule.REFILL, 100, 60)
TPM = BucketSpec("t-tpm", "tenant:t", Dimension.TOTAL_TOKENS, Rule.REFILL, 10_000, 60)
SLOTS = BucketSpec("p-slots", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 5)
BUCKETS = [TPM, RPM, SLOTS]
DEMAND = Usage(input_tokens=300, output_tokens=200)
ACTUAL = Usage(input_tokens=300, output_tokens=50)
NOW = 1_000_000.0


def store_on(url: str, prefix: str = "sp") -> RedisReservationStore:
    return RedisReservationStore(redis.asyncio.Redis.from_url(url), prefix=prefix)


def spec_keys(admin: redis.Redis, prefix: str = "sp") -> list[bytes]:
    return sorted(admin.scan_iter(match=f"{prefix}:spec:*"))


def levels_at(runner, store, now):
    return {level.bucket: level.available for level in runner.run(store.levels(BUCKETS, now=now))}


def test_a_request_ships_its_definitions_once_then_only_their_key(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    first = runner.run(store.reserve("a", BUCKETS, DEMAND, now=NOW))
    assert isinstance(first, Grant)
    [key] = spec_keys(admin)
    assert admin.pttl(key) > 6 * 86400 * 1000  # a week: sets no longer used go away
    admin.config_resetstat()
    before = admin.info("stats")["total_net_input_bytes"]
    second = runner.run(store.reserve("b", BUCKETS, DEMAND, now=NOW))
    sent = admin.info("stats")["total_net_input_bytes"] - before
    assert isinstance(second, Grant)
    assert spec_keys(admin) == [key]  # the same set, not a second copy
    assert sent < 400  # ids, amounts and one key: no bucket definitions
    runner.run(store.client.aclose())


def test_a_lost_spec_set_is_sent_again_and_the_call_happens_once(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    grant = runner.run(store.reserve("a", BUCKETS, DEMAND, now=NOW))
    assert isinstance(grant, Grant)
    held = levels_at(runner, store, NOW)
    admin.delete(*spec_keys(admin))  # as a TTL or a partial loss would
    settled = runner.run(store.reconcile(grant, ACTUAL, now=NOW))
    assert settled.outcome is Outcome.RECONCILED
    # Reconciled once: 150 output tokens came back to the tenant, the slot was released.
    after = levels_at(runner, store, NOW)
    assert after["t-tpm"] == held["t-tpm"] + 150
    assert after["p-slots"] == held["p-slots"] + 1
    assert len(spec_keys(admin)) == 1
    admin.delete(*spec_keys(admin))
    again = runner.run(store.reserve("b", BUCKETS, DEMAND, now=NOW))
    assert isinstance(again, Grant) and not again.replayed
    assert levels_at(runner, store, NOW)["t-tpm"] == after["t-tpm"] - 500  # taken once
    runner.run(store.client.aclose())


def test_after_flushall_the_store_and_the_fair_queue_register_again(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    queue = BrokerQueue(RedisQueueStore(store))

    async def admit(rid: str):
        return await queue.admit(
            rid, BUCKETS, DEMAND, pool=POOL, flow="t", weight=1.0,
            deadline=store.local_now() + 5, max_depth=10, flow_depth=10,
        )  # fmt: skip

    runner.run(store.bootstrap())
    grant = runner.run(admit("q1"))
    assert isinstance(grant, Grant)
    assert runner.run(queue.reconcile(grant, ACTUAL)).outcome is Outcome.RECONCILED
    direct = runner.run(store.reserve("d1", BUCKETS, DEMAND))
    assert isinstance(direct, Grant)
    admin.flushall()
    admin.function_flush()  # and the scripts' library: a restart without persistence
    runner.run(store.bootstrap())  # a new store: no learning period
    grant = runner.run(admit("q2"))
    assert isinstance(grant, Grant)
    assert runner.run(queue.reconcile(grant, ACTUAL)).outcome is Outcome.RECONCILED
    assert runner.run(store.release(direct)).outcome is Outcome.UNKNOWN  # lost with the state
    direct = runner.run(store.reserve("d2", BUCKETS, DEMAND))
    assert isinstance(direct, Grant)
    assert runner.run(store.release(direct)).outcome is Outcome.RELEASED
    assert spec_keys(admin)
    runner.run(queue.close())
    runner.run(store.client.aclose())


def test_a_renewal_asks_for_the_definitions_only_to_adopt_a_lease_lost_with_redis(
    redis_server, runner
):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    grant = runner.run(store.reserve("a", BUCKETS, DEMAND))
    assert isinstance(grant, Grant)
    runner.run(store.scripts_load())  # measured below: the renewal, not loading its script
    admin.config_resetstat()
    before = admin.info("stats")["total_net_input_bytes"]
    assert runner.run(store.renew(grant)).outcome is Outcome.RENEWED
    assert admin.info("stats")["total_net_input_bytes"] - before < 400  # no definitions
    admin.flushall()  # the lease, the slot it held and the spec set are gone
    assert runner.run(store.renew(grant)).outcome is Outcome.ADOPTED
    [slots] = runner.run(store.levels([SLOTS]))
    assert slots.available == SLOTS.capacity - 1  # the stream in flight holds its slot again
    runner.run(store.client.aclose())
