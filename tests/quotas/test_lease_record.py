"""The lease record (issue 19): one string written once when a reservation is granted, read
once when it is settled and marked settled in place, holding what settle and reap need
without the bucket definitions; a record of the version before (msgpack) still settles,
renews and reaps after a deploy. On a private redis-server, so command counts are the
store's alone."""

from __future__ import annotations

import json
import time

import redis
import redis.asyncio

from quotas.core.keys import bucket_key, holders_key, record_key
from quotas.core.model import BucketSpec, Dimension, Grant, Outcome, Rule, Usage, Window
from quotas.store.redis import RedisReservationStore

SLOTS = BucketSpec("l-slots", "app:l", Dimension.CONCURRENCY, Rule.CONCURRENCY, 4)
BUCKETS = [
    SLOTS,
    BucketSpec("l-spend", "tenant:l", Dimension.SPEND, Rule.ROLLING_WINDOW, 100.0, 3600),
    BucketSpec("l-day", "tenant:l", Dimension.TOTAL_TOKENS, Rule.FIXED_WINDOW, 1e9,
               window=Window.DAY),
    BucketSpec("l-rpm", "provider:l", Dimension.REQUESTS, Rule.REFILL, 1000, 60),
    BucketSpec("l-out", "provider:l", Dimension.OUTPUT_TOKENS, Rule.REFILL, 1e6, 60),
]  # fmt: skip
DEMAND = Usage(input_tokens=100, output_tokens=100, spend=0.01, concurrency=1)
ACTUAL = Usage(input_tokens=120, output_tokens=50, spend=0.02)
T = 1_000_000.0
# How the version before wrote a record (lib.lua record_write): a msgpack array.
LEGACY_WRITE = (
    "redis.call('SET', KEYS[1], cmsgpack.pack(unpack(cjson.decode(ARGV[1]))), 'PX', 600000)"
)


def store_on(url: str, prefix: str = "rec") -> RedisReservationStore:
    return RedisReservationStore(redis.asyncio.Redis.from_url(url), prefix=prefix)


def keyspace_events(events: redis.client.PubSub) -> list[str]:
    """The events on the subscribed key since the last call (string commands: ``K$``)."""
    seen, quiet_until = [], time.monotonic() + 0.3
    while time.monotonic() < quiet_until:
        message = events.get_message(timeout=0.05)
        if message is not None and message["type"] == "message":
            seen.append(message["data"].decode())
    return seen


def legacy_record(store: RedisReservationStore, grant: Grant, admin: redis.Redis) -> None:
    """Write ``grant``'s record over as the version before would have: {id, created, expires,
    state, rows (name, amount, marker, skipped), holds (bucket, holders, amount)}."""
    rows = [[p.bucket.name, p.amount, p.marker, 1 if p.skipped else 0] for p in grant.parts]
    holds = [
        [bucket_key(store.prefix, p.bucket), holders_key(store.prefix, p.bucket), p.amount]
        for p in grant.parts
        if p.bucket.rule is Rule.CONCURRENCY and not p.skipped
    ]
    record = [grant.reservation_id, grant.created_at, grant.expires_at, "active", rows, holds]
    key = record_key(store.prefix, grant.parts[0].bucket.scope, grant.reservation_id)
    admin.eval(LEGACY_WRITE, 1, key, json.dumps([record]))
    assert admin.get(key)[:1] == b"\x96"  # a msgpack array of 6


def test_it_writes_the_record_once_and_marks_it_settled_in_place(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    warm = runner.run(store.reserve("warm", BUCKETS, DEMAND, now=T))
    runner.run(store.reconcile(warm, ACTUAL, now=T + 1))

    key = record_key(store.prefix, SLOTS.scope, "r")
    # What is done to the record's key alone (bucket state may be strings too): its keyspace
    # events, which scripts' commands raise as clients' do.
    admin.config_set("notify-keyspace-events", "K$")
    events = admin.pubsub()
    events.subscribe(f"__keyspace@0__:{key}")
    grant = runner.run(store.reserve("r", BUCKETS, DEMAND, now=T + 2))
    assert isinstance(grant, Grant)
    reserved = keyspace_events(events)
    written = admin.get(key)
    result = runner.run(store.reconcile(grant, ACTUAL, now=T + 3))
    settled = keyspace_events(events)
    events.close()

    assert reserved == ["set"]  # written once
    assert result.outcome is Outcome.RECONCILED
    assert settled == ["setrange"]  # marked settled in place, not rewritten
    after = admin.get(key)
    assert after[1:] == written[1:] and after[:1] != written[:1]  # only the state changed
    # a number is 8 bytes, a name its own: no field names, no msgpack rows
    assert len(written) < 20 + len(BUCKETS) * 26 + sum(len(b.name) for b in BUCKETS) + 2 * 20
    # settled is settled: a second reconcile and a replay say so
    assert runner.run(store.reconcile(grant, ACTUAL, now=T + 4)).outcome is Outcome.CLOSED
    replay = runner.run(store.reserve("r", BUCKETS, DEMAND, now=T + 5))
    assert isinstance(replay, Grant) and replay.replayed and replay.state == "reconciled"
    assert [(p.bucket, p.amount, p.marker, p.skipped) for p in replay.parts] == [
        (p.bucket, p.amount, p.marker, p.skipped) for p in grant.parts
    ]
    runner.run(store.client.aclose())


def test_a_record_of_the_version_before_settles_as_its_twin_does(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    results = {}
    for prefix in ("new", "old"):
        store = store_on(redis_server.url, prefix)
        runner.run(store.bootstrap())
        grant = runner.run(store.reserve("a", BUCKETS, DEMAND, now=T))
        assert isinstance(grant, Grant)
        if prefix == "old":
            legacy_record(store, grant, admin)
        renewed = runner.run(store.renew(grant, now=T + 10, lease_seconds=60))
        results[prefix] = (
            renewed.outcome,
            runner.run(store.reconcile(grant, ACTUAL, now=T + 20)),
            runner.run(store.levels(BUCKETS, now=T + 21)),
        )
        runner.run(store.client.aclose())
    assert results["old"] == results["new"]
    assert results["old"][0] is Outcome.RENEWED
    assert results["old"][2][0].available == SLOTS.capacity  # its slot is back


def test_a_record_of_the_version_before_is_reaped_with_its_slot_given_back(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url, "reap")
    runner.run(store.bootstrap())
    grant = runner.run(store.reserve("gone", BUCKETS, DEMAND, now=T, lease_seconds=30))
    assert isinstance(grant, Grant)
    legacy_record(store, grant, admin)
    assert runner.run(store.levels([SLOTS], now=T + 1))[0].available == SLOTS.capacity - 1

    [expired] = runner.run(store.reap(now=T + 31))

    assert expired.reservation_id == "gone"
    assert (expired.created_at, expired.expires_at) == (grant.created_at, grant.expires_at)
    assert expired.taken == tuple((p.bucket.name, p.amount) for p in grant.parts)
    held = admin.hget(bucket_key(store.prefix, SLOTS), "held")
    assert float(held) == 0  # released by the reap itself, not left to a later sweep
    assert runner.run(store.reconcile(grant, ACTUAL, now=T + 32)).outcome is Outcome.CLOSED
    runner.run(store.client.aclose())
