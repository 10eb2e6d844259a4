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
