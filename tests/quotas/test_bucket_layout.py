"""Bucket state layouts (lua/lib.lua): a refill, fixed-window or ramp bucket keeps its state as
one packed string at its ':bp:' key, a rolling window a hash of packed doubles there;
concurrency keeps its hash of numbers at ':b:'. During a deploy the gateway of the version
before still runs beside the new one, and Redis still holds the layout before's ':b:' keys of
the packed rules: the new scripts read (a rolling window: copy) such a key while their packed
key is missing (nothing a bucket holds is forgotten), write only the packed key (with a TTL of
its own), and leave the old key as the old scripts expect it. On a private redis-server."""

from __future__ import annotations

import struct

import redis
import redis.asyncio

from quotas.core.fairqueue import Queued
from quotas.core.keys import bucket_key, legacy_bucket_key
from quotas.core.model import BucketSpec, Dimension, Grant, Refusal, Rule, Usage, Window
from quotas.store.queue_redis import RedisQueueStore
from quotas.store.redis import RedisReservationStore, queue_prefix

SCOPE = "provider:l"
RPM = BucketSpec("l-rpm", SCOPE, Dimension.REQUESTS, Rule.REFILL, 100, 60)
DAY = BucketSpec("l-day", SCOPE, Dimension.INPUT_TOKENS, Rule.FIXED_WINDOW, 1000, window=Window.DAY)
RAMP = BucketSpec("l-ramp", SCOPE, Dimension.REQUESTS, Rule.RAMP, 10, 60, factor=2.0)
SLOTS = BucketSpec("l-slots", SCOPE, Dimension.CONCURRENCY, Rule.CONCURRENCY, 4)
SPEND = BucketSpec("l-spend", "tenant:l", Dimension.SPEND, Rule.ROLLING_WINDOW, 10.0, 3600)
T = 1_000_020.0  # 20 s into a ramp interval (60 s)
P = "lay"


def store_on(url: str) -> RedisReservationStore:
    return RedisReservationStore(redis.asyncio.Redis.from_url(url), prefix=P)


def g(x: float) -> str:
    return repr(float(x))  # what the hash layout's scripts wrote (%.17g: the same double)


def reserve(runner, store, rid, spec, now, **usage) -> Grant | Refusal:  # type: ignore[no-untyped-def]
    return runner.run(store.reserve(rid, [spec], Usage(**usage), now=now))


def available(runner, store, spec, now) -> float:  # type: ignore[no-untyped-def]
    return runner.run(store.levels([spec], now=now))[0].available


def test_packed_rules_have_keys_of_their_own_and_concurrency_keeps_its_own():
    for spec in (RPM, DAY, RAMP, SPEND):
        assert bucket_key(P, spec) == f"{P}:{{{spec.scope}}}:bp:{spec.name}"
        assert legacy_bucket_key(P, spec) == f"{P}:{{{spec.scope}}}:b:{spec.name}"
    assert bucket_key(P, SLOTS) == legacy_bucket_key(P, SLOTS)


def test_it_writes_a_packed_bucket_as_three_doubles_with_a_ttl(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    runner.run(store.client.hset(f"{P}:epoch", mapping={"born": "0", "until": "0"}))
    assert isinstance(reserve(runner, store, "a", RPM, T, requests=30), Grant)
    raw = admin.get(bucket_key(P, RPM))
    assert raw is not None and admin.type(bucket_key(P, RPM)) == b"string"
    level, ts, exp = struct.unpack("<ddd", raw)
    assert (level, ts) == (70.0, T) and exp > T
    assert 0 < admin.pttl(bucket_key(P, RPM)) <= (exp - T) * 1000 + 60_000
    assert admin.exists(legacy_bucket_key(P, RPM)) == 0


def test_it_reads_a_refill_bucket_left_in_the_hash_layout(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    admin.hset(f"{P}:epoch", mapping={"born": "0", "until": "0"})
    old = legacy_bucket_key(P, RPM)
    admin.hset(old, mapping={"level": g(10), "ts": g(T), "exp": g(T + 200)})
    admin.pexpire(old, 260_000)

    assert available(runner, store, RPM, T) == 10  # not a full bucket: the hash's level
    refused = reserve(runner, store, "big", RPM, T, requests=50)
    assert isinstance(refused, Refusal) and refused.bucket == RPM.name
    assert isinstance(reserve(runner, store, "small", RPM, T, requests=4), Grant)
    assert available(runner, store, RPM, T) == 6
    # the packed key has the state and a TTL; the hash is as the old scripts left it
    assert struct.unpack("<ddd", admin.get(bucket_key(P, RPM)))[:2] == (6.0, T)
    assert admin.pttl(bucket_key(P, RPM)) > 0
    assert admin.hgetall(old) == {
        b"level": b"10.0",
        b"ts": g(T).encode(),
        b"exp": g(T + 200).encode(),
    }


def test_it_reads_a_fixed_window_and_a_ramp_left_in_the_hash_layout(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    admin.hset(f"{P}:epoch", mapping={"born": "0", "until": "0"})
    # the window's boundaries as the scripts pick them: from a first take, then forgotten
    assert isinstance(reserve(runner, store, "probe", DAY, T, input_tokens=1), Grant)
    wstart, wend, _ = struct.unpack("<ddd", admin.get(bucket_key(P, DAY)))
    admin.delete(bucket_key(P, DAY))
    old = legacy_bucket_key(P, DAY)
    admin.hset(old, mapping={"wstart": g(wstart), "wend": g(wend), "used": g(900)})
    admin.pexpire(old, int((wend - T) * 1000) + 60_000)
    interval = T // 60
    admin.hset(legacy_bucket_key(P, RAMP), mapping={"cur": g(interval), "cur_used": g(8),
                                                     "prev_used": g(3)})  # fmt: skip

    assert available(runner, store, DAY, T) == 100
    assert isinstance(reserve(runner, store, "w1", DAY, T, input_tokens=150), Refusal)
    assert isinstance(reserve(runner, store, "w2", DAY, T, input_tokens=60), Grant)
    assert available(runner, store, DAY, T + 1) == 40
    assert 0 < admin.pttl(bucket_key(P, DAY)) <= (wend - T) * 1000 + 60_000

    # allowance max(floor 10, 2 x 3) = 10, 8 used in this interval
    assert available(runner, store, RAMP, T) == 2
    assert isinstance(reserve(runner, store, "r1", RAMP, T, requests=3), Refusal)
    assert isinstance(reserve(runner, store, "r2", RAMP, T, requests=2), Grant)
    assert struct.unpack("<ddd", admin.get(bucket_key(P, RAMP))) == (interval, 10.0, 3.0)
    assert admin.pttl(bucket_key(P, RAMP)) > 0
    assert admin.type(legacy_bucket_key(P, DAY)) == b"hash"
    assert admin.hget(legacy_bucket_key(P, DAY), "used") == g(900).encode()


POOL = "provider:q"
QRPM = BucketSpec("q-rpm", POOL, Dimension.REQUESTS, Rule.REFILL, 1, 1.0)
QSLOTS = BucketSpec("q-slots", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 8)
# An entry as the version before stored it: its eleven fields (no 'packed' mark).
AS_BEFORE = """
local raw = redis.call('GET', KEYS[1])
local t = cmsgpack.unpack(string.sub(raw, 2))
redis.call('SET', KEYS[1], 'Q' .. cmsgpack.pack({t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8],
                                                 t[9], t[10], t[11]}), 'KEEPTTL')
return {t[10][1][3], t[10][2][3], t[12]}
"""


def test_a_waiter_of_either_version_is_granted_from_the_packed_bucket(redis_server, runner):
    """A waiter's entry names a packed bucket by its hash-layout key (what a pump of the
    version before can read); a pump of this version takes from the packed key and answers a
    waiter of the version before with the text grant it parses."""
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    queue = RedisQueueStore(store, mailbox="m")
    runner.run(store.bootstrap())
    admin.hset(f"{P}:epoch", mapping={"born": "0", "until": "0"})

    def enter(rid: str) -> object:
        demand = Usage(requests=1, concurrency=1)
        entering = queue.enter(
            rid, [QSLOTS, QRPM], demand, pool=POOL, flow="f", weight=1.0, deadline=T + 4,
            max_depth=8, flow_depth=8, lease_seconds=30.0, burst=0.0, now=T,
        )  # fmt: skip
        return runner.run(entering)

    assert isinstance(enter("a"), Grant)
    assert isinstance(enter("b"), Queued) and isinstance(enter("c"), Queued)
    entry = f"{queue_prefix(P, POOL)}:e:c"
    keys = admin.eval(AS_BEFORE, 1, entry)
    assert keys == [bucket_key(P, QSLOTS).encode(), legacy_bucket_key(P, QRPM).encode(), 1]
    assert admin.get(entry)[:1] == b"Q"

    verdicts: dict[str, object] = {}
    for at in (T + 1.01, T + 2.02):
        assert runner.run(queue.pump(POOL, now=at)).granted == 1
        verdicts.update(runner.run(queue.mail(timeout=0.5, now=at)))
    # the verdicts as kept in the entries: b's packed, c's (the version before) as text
    assert admin.get(f"{queue_prefix(P, POOL)}:e:b")[:2] == b"Vg"
    assert admin.get(entry)[:2] == b"VG"
    b, c = verdicts["b"], verdicts["c"]
    assert isinstance(b, Grant) and isinstance(c, Grant)
    assert (b.created_at, c.created_at) == (T + 1.01, T + 2.02)
    assert [p.remaining for p in b.parts] == [6.0, 0.0]  # a and b hold slots; the level is 0
    assert [p.remaining for p in c.parts] == [5.0, 0.0]
    assert struct.unpack("<ddd", admin.get(bucket_key(P, QRPM)))[:2] == (0.0, T + 2.02)
    assert admin.exists(legacy_bucket_key(P, QRPM)) == 0


def test_it_copies_a_rolling_window_left_in_the_hash_layout(redis_server, runner):
    admin = redis.Redis(port=redis_server.port)
    store = store_on(redis_server.url)
    runner.run(store.bootstrap())
    admin.hset(f"{P}:epoch", mapping={"born": "0", "until": "0"})
    width = 3600 / 60  # 60 slices of the hour
    k = int(T // width)
    old = legacy_bucket_key(P, SPEND)
    slices = {f"s{k - 30}": g(2.5), f"s{k - 1}": g(4.0), f"s{k}": g(1.5)}
    admin.hset(old, mapping={"total": g(8), "lo": g(k - 30), "hi": g(k), "exp": g(T + 4000),
                             **slices})  # fmt: skip
    admin.pexpire(old, 4_060_000)

    assert available(runner, store, SPEND, T) == 2  # 10 - 8
    assert isinstance(reserve(runner, store, "s1", SPEND, T, spend=3.0), Refusal)
    grant = reserve(runner, store, "s2", SPEND, T, spend=1.5)
    assert isinstance(grant, Grant) and grant.parts[0].marker == k
    new = bucket_key(P, SPEND)
    state = admin.hgetall(new)
    assert struct.unpack("<dddd", state[b"p"]) == (9.5, k - 30, k, T + 4000)
    assert {f: struct.unpack("<d", v)[0] for f, v in state.items() if f != b"p"} == {
        f"s{k - 30}".encode(): 2.5,
        f"s{k - 1}".encode(): 4.0,
        f"s{k}".encode(): 3.0,
    }
    assert 0 < admin.pttl(new) <= 4_060_000
    # the slice taken 30 slices ago leaves the window at its end (+ the hour)
    assert available(runner, store, SPEND, (k - 29) * width + 3600 + 1) == 3.0
    assert admin.hget(old, "total") == g(8).encode()
