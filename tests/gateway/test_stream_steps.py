"""``gateway.steps.StreamSteps`` on a real Redis (SPEC C10 in steps): one step in flight at a
time and never waited for, no more steps after a refusal, and the settle after every step —
including one whose call reaches Redis only after the settle, which then takes nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
import redis.asyncio

from gateway.steps import StreamSteps
from quotas.broker import Broker
from quotas.core.increments import StepPlan
from quotas.core.model import (
    BucketSpec,
    Dimension,
    Extension,
    Grant,
    Outcome,
    Rule,
    Usage,
    Window,
)
from quotas.store.redis import RedisReservationStore
from tests.quotas.conftest import REDIS_URL, delete_prefix, unique_prefix

OUT = BucketSpec(
    "out", "app:web", Dimension.OUTPUT_TOKENS, Rule.FIXED_WINDOW, 100, window=Window.DAY
)
SPEND = BucketSpec("spend", "tenant:acme", Dimension.SPEND, Rule.FIXED_WINDOW, 1, window=Window.DAY)
SLOTS = BucketSpec("slots", "provider:p", Dimension.CONCURRENCY, Rule.CONCURRENCY, 4)
BUCKETS = [OUT, SPEND, SLOTS]
PLAN = StepPlan(step_tokens=16)  # top up when fewer than 8 reserved tokens are left
PRICE_OUTPUT = 2000.0  # USD per million: a step of 16 costs 0.032


@pytest.fixture
def prefix() -> Iterator[str]:
    p = unique_prefix()
    redis.Redis.from_url(REDIS_URL).hset(f"{p}:epoch", mapping={"born": "0", "until": "0"})
    yield p
    delete_prefix(REDIS_URL, p)


@dataclass
class Holder:
    grant: Grant


class SlowStore(RedisReservationStore):
    """Each extension reaches Redis ``delay`` seconds after it is asked for — and reaches it
    even when the asker stopped waiting (a call already on the wire)."""

    delay = 0.2
    calls = 0
    landed: list[Extension]

    async def extend(self, grant: Grant, more: Usage, *, now: float | None = None) -> Extension:
        self.calls += 1

        async def on_the_wire() -> Extension:
            await asyncio.sleep(self.delay)
            result = await RedisReservationStore.extend(self, grant, more)
            self.landed.append(result)
            return result

        self.wire = asyncio.ensure_future(on_the_wire())
        return await asyncio.shield(self.wire)


async def stream_start(prefix: str, delay: float = 0.2):
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    store = SlowStore(client, prefix=prefix)
    store.delay, store.landed = delay, []
    broker = Broker(store)
    first = Usage(input_tokens=10, output_tokens=16, spend=16 * PRICE_OUTPUT / 1e6)
    grant = await store.reserve("s-1", BUCKETS, first)
    assert isinstance(grant, Grant)
    return client, store, broker, Holder(grant)


async def available(store: RedisReservationStore) -> list[float]:
    return [level.available for level in await store.levels([OUT, SPEND])]


def usage(output_tokens: int) -> Usage:
    return Usage(
        input_tokens=10, output_tokens=output_tokens, spend=output_tokens * PRICE_OUTPUT / 1e6
    )


def steps_of(broker: Broker, holder: Holder, **options: float) -> StreamSteps:
    return StreamSteps(
        PLAN,
        max_output=64,
        reserved=16,
        price_output=PRICE_OUTPUT,
        broker=broker,
        holder=holder,
        **options,
    )


def test_it_asks_one_step_at_a_time_without_waiting_for_it(prefix: str) -> None:
    async def scenario() -> None:
        client, store, broker, holder = await stream_start(prefix)
        steps = steps_of(broker, holder)
        started = time.monotonic()
        for generated in range(9, 30):  # tokens keep coming while the first step is on its way
            steps.progress(generated)
        assert time.monotonic() - started < 0.05  # the stream never waited for Redis
        await asyncio.sleep(0.05)  # the step's task starts; still on the wire
        assert store.calls == 1 and not store.landed
        await steps.drain()
        assert steps.steps == ["granted"] and steps.reserved == 32
        assert holder.grant.taken() == {"out": 32, "spend": 0.064, "slots": 1}
        # The stream outran its reservation meanwhile: the next step covers what it made.
        steps._over = False
        steps.progress(30)
        await steps.drain()
        assert store.calls == 2 and steps.reserved == 48  # one more step of 16
        await client.aclose()

    asyncio.run(scenario())


def test_it_asks_no_further_step_after_a_refusal_and_the_stream_settles_its_usage(
    prefix: str,
) -> None:
    async def scenario() -> None:
        client, store, broker, holder = await stream_start(prefix, delay=0.0)
        await store.reserve("other", [OUT], Usage(output_tokens=80))  # 4 tokens left
        steps = steps_of(broker, holder)
        steps.progress(9)
        await asyncio.sleep(0.1)
        assert steps.steps == ["refused"] and steps.refused
        for generated in range(10, 60):
            steps.progress(generated)
        await steps.drain()
        assert store.calls == 1  # no more asked
        result = await broker.reconcile(holder.grant, usage(60))
        assert result.outcome is Outcome.RECONCILED
        assert (await available(store))[0] == 100 - 80 - 60  # real usage, in debt
        await client.aclose()

    asyncio.run(scenario())


def test_the_settle_comes_after_the_step_in_flight(prefix: str) -> None:
    async def scenario() -> None:
        client, store, broker, holder = await stream_start(prefix, delay=0.2)
        steps = steps_of(broker, holder)
        steps.progress(9)
        await steps.drain()  # the stream ended while its step was on the wire
        assert [e.outcome for e in store.landed] == [Outcome.EXTENDED]
        assert holder.grant.taken()["out"] == 32
        steps.progress(40)  # a chunk after the end asks nothing
        await broker.reconcile(holder.grant, usage(20))
        assert await available(store) == [100 - 20, pytest.approx(1 - 0.04)]
        assert store.calls == 1
        await client.aclose()

    asyncio.run(scenario())


def test_a_step_that_reaches_redis_after_the_settle_takes_nothing(prefix: str) -> None:
    async def scenario() -> None:
        client, store, broker, holder = await stream_start(prefix, delay=0.3)
        steps = steps_of(broker, holder, drain_seconds=0.05)
        steps.progress(9)
        await steps.drain()  # gave up on it after 0.05 s: the settle goes first
        assert steps.reserved == 16 and not store.landed
        await broker.reconcile(holder.grant, usage(12))
        await store.wire  # the step lands now, on a settled lease
        assert [e.outcome for e in store.landed] == [Outcome.CLOSED]
        # Nothing is held until the lease would have run out: the bucket counts real usage.
        assert await available(store) == [100 - 12, pytest.approx(1 - 12 * PRICE_OUTPUT / 1e6)]
        assert not await client.zrange(f"{prefix}:leases", 0, -1)
        await client.aclose()

    asyncio.run(scenario())
