"""``Broker.held`` (C9, C10): the lease of a long request is renewed while it runs, and the
renewing stops when the request ends — even when the cancellation that stops it is swallowed
by a Redis call it interrupts (redis-py, around a server that was just killed, can turn it into
an error; the renewal suppresses errors). Before, that kept the renewal alive and the request
that waited for it hung (tests/e2e/test_redis_restart.py, about one run in five on a busy
machine)."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from quotas.broker import Broker
from quotas.core.model import BucketSpec, Dimension, Grant, Rule, Usage
from quotas.store.redis import RedisReservationStore
from tests.quotas.conftest import REDIS_URL

SLOTS = BucketSpec("provider-slots", "provider:theta", Dimension.CONCURRENCY, Rule.CONCURRENCY, 2)
LEASE = 0.3  # renewed every 0.1 s


class SwallowingStore(RedisReservationStore):
    """A store whose renewal turns a cancellation into an error, as a library may."""

    renewals = 0

    async def renew(self, grant: Grant):  # type: ignore[no-untyped-def]
        self.renewals += 1
        try:
            await asyncio.sleep(0.2)  # slow: the request ends while a renewal is under way
            return await super().renew(grant)
        except asyncio.CancelledError:
            raise RuntimeError("the cancellation, swallowed") from None


@pytest.mark.timeout(20)  # before the fix this hung: held's exit waited for the renewal forever
def test_the_renewal_stops_with_the_request_even_if_a_call_swallows_its_cancellation(
    prefix: str,
) -> None:
    async def scenario() -> tuple[float, int]:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        store = SwallowingStore(client, prefix=prefix, lease_seconds=LEASE)
        broker = Broker(store)
        grant = await store.reserve("long-1", [SLOTS], Usage(concurrency=1.0))
        assert isinstance(grant, Grant)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(3):
            async with broker.held(grant):
                await asyncio.sleep(0.15)  # a renewal starts at 0.1 s and runs until 0.3 s
            ended = loop.time()
        renewals = store.renewals
        await asyncio.sleep(0.5)  # nothing renews once the request is over
        assert store.renewals == renewals
        await client.aclose()
        return loop.time() - ended, renewals

    after, renewals = asyncio.run(scenario())
    assert renewals == 1
    assert after >= 0.5


class CountingStore(RedisReservationStore):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.renewed: dict[str, list[float]] = {}

    async def renew(self, grant: Grant):  # type: ignore[no-untyped-def]
        self.renewed.setdefault(grant.reservation_id, []).append(asyncio.get_running_loop().time())
        return await super().renew(grant)


@pytest.mark.timeout(20)
def test_leases_held_together_are_each_renewed_every_third_of_a_lease_and_outlive_it(
    prefix: str,
) -> None:
    """One keeper renews every lease held on the loop, each on its own schedule: a lease held
    for 2.5 leases is never lost (both slots still taken, a third request refused), and one
    that ended is not renewed again."""

    async def scenario() -> tuple[dict[str, list[float]], dict[str, float], bool, int]:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        store = CountingStore(client, prefix=prefix, lease_seconds=LEASE)
        broker = Broker(store)
        loop = asyncio.get_running_loop()
        started: dict[str, float] = {}

        async def long(name: str, delay: float, seconds: float) -> None:
            await asyncio.sleep(delay)
            grant = await store.reserve(name, [SLOTS], Usage(concurrency=1.0))
            assert isinstance(grant, Grant)
            async with broker.held(grant):
                started[name] = loop.time()
                await asyncio.sleep(seconds)
            await store.release(grant)

        short = asyncio.create_task(long("short", 0.0, 0.05))
        first = asyncio.create_task(long("long-a", 0.06, 0.75))
        second = asyncio.create_task(long("long-b", 0.11, 0.75))
        # two leases after long-a began, 0.1 s before it ends: both still hold their slot (at
        # 0.8 s, 2.5 leases, a busy loop's late wake-up found long-a just over)
        await asyncio.sleep(0.7)
        third = await store.reserve("third", [SLOTS], Usage(concurrency=1.0))
        await asyncio.gather(short, first, second)
        renewals_at_end = sum(len(v) for v in store.renewed.values())
        await asyncio.sleep(0.3)  # nothing renews once every request is over
        assert sum(len(v) for v in store.renewed.values()) == renewals_at_end
        await client.aclose()
        return store.renewed, started, isinstance(third, Grant), renewals_at_end

    renewed, started, third_granted, _ = asyncio.run(scenario())

    assert "short" not in renewed  # over before its first third
    assert not third_granted
    for name in ("long-a", "long-b"):
        times = renewed[name]
        assert 6 <= len(times) <= 8, times  # every 0.1 s over 0.75 s
        gaps = [b - a for a, b in zip([started[name], *times], times, strict=False)]
        assert all(0.09 <= gap <= 0.2 for gap in gaps), gaps
