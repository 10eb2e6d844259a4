"""Broker state that heals itself (quotas/recovery.py) on a real Redis and PostgreSQL: members
in the database, reports in the epoch, reservations re-registered by the processes holding them.

Each ``Broker`` here is one process: its own holdings and membership, one shared Redis prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest
import redis.asyncio
from asgiref.sync import sync_to_async
from django.db import connections

from quotas.broker import AttemptBuckets, Broker, Turn
from quotas.core.fairqueue import QueueRefusal
from quotas.core.keys import epoch_key
from quotas.core.model import BucketSpec, Dimension, Grant, Reason, Refusal, Rule, Usage
from quotas.core.recovery import LIVE_SECONDS
from quotas.models import BrokerMember
from quotas.recovery import Recovery
from quotas.snapshot import ScopedBucket
from quotas.store.redis import RedisReservationStore
from tests.quotas.conftest import REDIS_URL, delete_prefix, unique_prefix

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 30.0
SLOTS = BucketSpec("provider-slots", "provider:theta", Dimension.CONCURRENCY, Rule.CONCURRENCY, 2)
ONE = Usage(requests=1.0, concurrency=1.0)


@pytest.fixture
def prefix() -> Iterator[str]:
    name = unique_prefix()
    yield name
    delete_prefix(REDIS_URL, name)


def process(prefix: str, name: str, *, allowances: int = 0) -> tuple[Broker, Recovery]:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    store = RedisReservationStore(client, prefix=prefix, lease_seconds=LEASE)
    broker = Broker(store, allowance_requests=allowances)
    return broker, Recovery(broker, name)


async def reserve(broker: Broker, rid: str) -> Grant | Refusal:
    result = await broker.store.reserve(rid, [SLOTS], ONE)
    if isinstance(result, Grant):
        broker.holdings.add(result)
    return result


async def epoch_fields(prefix: str) -> dict[bytes, bytes]:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        return await client.hgetall(epoch_key(prefix))
    finally:
        await client.aclose()


def member_exists(member: str) -> bool:
    return BrokerMember.objects.filter(pk=member).exists()


def run(scenario: Coroutine[Any, Any, None]) -> None:
    """Run a scenario; the connection its database work opened (asgiref's thread) closes."""

    async def closing() -> None:
        try:
            await scenario
        finally:
            await sync_to_async(connections.close_all)()

    asyncio.run(closing())


async def lose_state(prefix: str) -> None:
    await asyncio.to_thread(delete_prefix, REDIS_URL, prefix)


def test_a_fresh_redis_is_known_new_when_the_first_process_joins(prefix: str) -> None:
    async def scenario() -> None:
        broker, recovery = process(prefix, "gateway")
        await recovery.join()
        try:
            # No learning period: the first request to a concurrency limit is served.
            first = await reserve(broker, "first")
            assert isinstance(first, Grant)
            await broker.store.release(first)
            broker.holdings.settled(first)
            fields = await epoch_fields(prefix)
            assert float(fields[b"until"]) <= time.time()
            assert float(fields[b"born"]) == 0.0  # refill buckets start full
            assert await sync_to_async(member_exists)(recovery.member)
        finally:
            await recovery.leave()

    run(scenario())
    assert not BrokerMember.objects.exists()  # left holding nothing: its row went with it


def test_a_lost_state_is_healed_when_every_live_process_has_reported(prefix: str) -> None:
    async def scenario() -> None:
        a, ra = process(prefix, "gateway-a")
        b, rb = process(prefix, "gateway-b")
        await ra.join()
        await rb.join()
        try:
            assert isinstance(await reserve(a, "a-1"), Grant)
            assert isinstance(await reserve(b, "b-1"), Grant)  # both slots are out
            await lose_state(prefix)

            await ra.beat()  # a re-registers its slot and reports; b is live and silent yet
            refused = await reserve(a, "a-2")
            assert isinstance(refused, Refusal) and refused.reason is Reason.RECOVERING
            assert ra.verdict is not None and ra.verdict.waiting_for == (rb.member,)
            assert ra.expected_end is not None and ra.expected_end < time.time() + 3

            await rb.beat()  # the last live process reports: learning ends at once
            fields = await epoch_fields(prefix)
            assert float(fields[b"until"]) <= time.time()
            # Both slots were re-registered: nothing more is let in than the capacity.
            full = await reserve(a, "a-3")
            assert isinstance(full, Refusal) and full.reason is Reason.BUCKET_EXHAUSTED
            [grant] = a.holdings.held(time.time())
            assert (await a.store.release(grant)).outcome.value == "released"
            a.holdings.settled(grant)
            assert isinstance(await reserve(a, "a-4"), Grant)
        finally:
            await ra.leave()
            await rb.leave()

    run(scenario())


def test_a_process_that_stopped_silently_holds_learning_for_its_leases(prefix: str) -> None:
    async def scenario() -> None:
        a, ra = process(prefix, "gateway-a")
        await ra.join()
        try:
            now = a.store.local_now()
            # A process seen a moment ago that stopped without a word (SIGKILL).
            seen = now - LIVE_SECONDS - 1.0
            await sync_to_async(BrokerMember.objects.create)(
                id="gateway-dead", started=now - 60, last_seen=seen
            )
            await lose_state(prefix)
            await ra.beat()
            fields = await epoch_fields(prefix)
            until = float(fields[b"until"])
            # Its leases may run to a lease after it was last alive, not to the epoch's end.
            assert until == pytest.approx(seen + LIVE_SECONDS + LEASE, abs=0.01)
            refused = await reserve(a, "a-1")
            assert isinstance(refused, Refusal) and refused.reason is Reason.RECOVERING
        finally:
            await ra.leave()

    run(scenario())


def test_the_heartbeat_tells_the_allowances_of_a_pause_another_process_set(prefix: str) -> None:
    """A request granted from an allowance reads no pause in Redis; the heartbeat's look at
    the epoch does (``quotas.allowances``): after it, the paused account's requests are
    refused, not granted from the allowance that is still young."""
    plenty = BucketSpec("plenty", "provider:theta", Dimension.CONCURRENCY, Rule.CONCURRENCY, 1000)
    buckets = AttemptBuckets((ScopedBucket(plenty, "tenant"),), "provider:theta")
    no_wait = Turn(flow="acme", weight=1.0, deadline=1e12, max_depth=0, flow_depth=0)

    async def scenario() -> None:
        a, ra = process(prefix, "gateway-a", allowances=8)
        b, _ = process(prefix, "gateway-b")
        await ra.join()
        try:
            first = await a.admit("a-1", buckets, ONE, no_wait)
            assert isinstance(first, Grant)
            await a.reconcile(first, ONE)
            for _ in range(100):
                if a.allowances is not None and a.allowances._current:
                    break
                await asyncio.sleep(0.01)
            granted = await a.admit("a-2", buckets, ONE, no_wait)
            assert a.allowances is not None and a.allowances.owns(granted)
            await a.reconcile(granted, ONE)

            await b.pause_provider(buckets, retry_after=5.0, now=time.time())  # b's 429
            await ra.beat()
            refused = await a.admit("a-3", buckets, ONE, no_wait)
            assert isinstance(refused, QueueRefusal) and refused.reason is Reason.PAUSED
        finally:
            await ra.leave()

    run(scenario())


class LosesACancel(Recovery):
    """A heartbeat whose beat loses the cancel that lands in it, as something it awaited once
    did at a worker's shutdown (the worker never stopped)."""

    def __init__(self, broker: Broker, kind: str) -> None:
        super().__init__(broker, kind)
        self.beating = asyncio.Event()

    async def beat(self, *, poked: bool = False) -> None:
        self.beating.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(5.0)


def test_leaving_ends_the_heartbeat_even_when_a_beat_loses_the_cancel(prefix: str) -> None:
    async def scenario() -> None:
        broker, _ = process(prefix, "gateway-a")
        recovery = LosesACancel(broker, "gateway-a")
        await recovery.join()
        recovery.poke()
        await asyncio.wait_for(recovery.beating.wait(), timeout=5.0)
        async with asyncio.timeout(3.0):  # not a heartbeat that beats on for ever
            await recovery.leave()
        assert recovery._task is not None and recovery._task.done()

    run(scenario())
