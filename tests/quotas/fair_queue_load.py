"""Gateway-like client processes for the fair queue's multi-process tests (spawned children
import this). Each runs open-loop request streams through its own ``BrokerQueue`` (its own
Redis connections and mailbox) and returns what it saw."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import redis.asyncio

from quotas.core.model import BucketSpec, Dimension, Grant, Rule, Usage
from quotas.queue import BrokerQueue
from quotas.store.queue_redis import RedisQueueStore
from quotas.store.redis import RedisReservationStore

POOL = "provider:alpha"
# 20,000 tokens/s with a 0.1 s burst: 200 requests/s of 100 tokens.
POOL_TPM = BucketSpec("alpha-tpm", POOL, Dimension.TOTAL_TOKENS, Rule.REFILL, 2000, 0.1)
POOL_SLOTS = BucketSpec("alpha-conc", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 3)
REQUEST = Usage(input_tokens=60, output_tokens=40)


def pooled_client(url: str) -> redis.asyncio.Redis:
    """A client whose calls wait for a free connection: redis-py 8's default pool raises
    MaxConnectionsError beyond 100 connections, and a gateway has more requests in flight."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=64, timeout=10)
    return redis.asyncio.Redis(connection_pool=pool)


def tenant_bucket(name: str) -> BucketSpec:
    return BucketSpec(f"{name}-rpm", f"tenant:{name}", Dimension.REQUESTS, Rule.REFILL, 1e6, 60)


@dataclass
class Stream:
    tenant: str
    rate: float  # requests per second, open loop
    phase: float = 0.0
    hold: float = 0.0  # seconds between grant and reconcile (a dispatch)


@dataclass
class Seen:
    arrivals: dict[str, list[float]] = field(default_factory=dict)  # tenant → arrival times
    granted: dict[str, list[float]] = field(default_factory=dict)  # tenant → arrival times
    held: list[tuple[float, float]] = field(default_factory=list)  # (granted, released)
    waits: dict[str, list[float]] = field(default_factory=dict)  # tenant → admit latency
    late: list[float] = field(default_factory=list)  # time past the deadline at the verdict
    reasons: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


async def _streams(
    url: str,
    prefix: str,
    streams: list[Stream],
    pool_buckets: list[BucketSpec],
    start_at: float,
    seconds: float,
    patience: float,
) -> Seen:
    client = pooled_client(url)
    queue = BrokerQueue(RedisQueueStore(RedisReservationStore(client, prefix=prefix)))
    seen = Seen()
    tasks: set[asyncio.Task[None]] = set()
    n = 0

    async def one(s: Stream, rid: str) -> None:
        arrived = time.time()
        seen.arrivals.setdefault(s.tenant, []).append(arrived)
        deadline = arrived + patience
        try:
            result = await queue.admit(
                rid,
                [tenant_bucket(s.tenant), *pool_buckets],
                REQUEST,
                pool=POOL,
                flow=s.tenant,
                weight=1.0,
                deadline=deadline,
                max_depth=400,
                flow_depth=50,
            )
        except Exception as exc:
            seen.errors.append(repr(exc))
            return
        now = time.time()
        if not isinstance(result, Grant):
            seen.reasons[result.reason.value] += 1
            seen.late.append(now - deadline)
            return
        assert result.created_at < deadline
        seen.granted.setdefault(s.tenant, []).append(arrived)
        seen.waits.setdefault(s.tenant, []).append(now - arrived)
        if s.hold:
            await asyncio.sleep(s.hold)
        seen.held.append((result.created_at, time.time()))
        await queue.reconcile(result, REQUEST)

    async def run(s: Stream) -> None:
        nonlocal n
        k = 0
        while (at := start_at + s.phase + k / s.rate) < start_at + seconds:
            await asyncio.sleep(max(0.0, at - time.time()))
            n += 1
            task = asyncio.create_task(one(s, f"{s.tenant}-{id(queue)}-{n}"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            k += 1

    await asyncio.gather(*(run(s) for s in streams))
    while tasks:
        await asyncio.gather(*tasks)
    await queue.close()
    await client.aclose()
    return seen


def streams_worker(
    url: str,
    prefix: str,
    streams: list[Stream],
    pool_buckets: list[BucketSpec],
    start_at: float,
    seconds: float,
    patience: float,
) -> Seen:
    """One gateway process: run ``streams`` from ``start_at`` for ``seconds``."""
    import uvloop

    return uvloop.run(_streams(url, prefix, streams, pool_buckets, start_at, seconds, patience))
