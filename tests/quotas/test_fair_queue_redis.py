"""The fair queue under real time and real concurrency: ``BrokerQueue`` over Redis (and, where
the behaviour is the same, over the in-memory twin), with several OS processes sharing one
queue. Bounded in time: each test runs a few seconds at most."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import statistics
import time
from typing import Any

import pytest
import redis
import redis.asyncio

from quotas.core.fairqueue import (
    MAILBOX_ALIVE_SECONDS,
    QueueReason,
    QueueRefusal,
    jain_index,
    weighted_max_min,
)
from quotas.core.model import BucketSpec, Dimension, Grant, Rule, Usage
from quotas.core.queuebook import QueueBook
from quotas.queue import BrokerQueue
from quotas.store.memory import MemoryReservationStore
from quotas.store.queue_memory import MemoryQueueStore
from quotas.store.queue_redis import RedisQueueStore, queue_prefix
from quotas.store.redis import RedisReservationStore
from tests.quotas import fair_queue_load as load
from tests.quotas.conftest import REDIS_URL, delete_prefix
from tests.quotas.fair_queue_load import pooled_client

pytestmark = pytest.mark.slow
SPAWN = multiprocessing.get_context("spawn")
POOL = load.POOL
SLOTS = BucketSpec("alpha-conc", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 2)
TPM = BucketSpec("alpha-tpm", POOL, Dimension.TOTAL_TOKENS, Rule.REFILL, 1000, 1.0)


class Queues:
    """A ``BrokerQueue`` on Redis or on the in-memory twin (real clock), and what is left."""

    def __init__(self, kind: str, prefix: str) -> None:
        self.kind = kind
        self.prefix = prefix
        if kind == "memory":
            self.memory = MemoryReservationStore(clock=time.time)
            self.qstore: Any = MemoryQueueStore(QueueBook(self.memory.book), clock=time.time)
        else:
            self.client = pooled_client(REDIS_URL)
            self.store = RedisReservationStore(self.client, prefix=prefix)
            self.qstore = RedisQueueStore(self.store)
        self.queue = BrokerQueue(self.qstore)

    async def available(self, spec: BucketSpec) -> float:
        if self.kind == "memory":
            return self.memory.levels([spec])[0].available
        return (await self.store.levels([spec]))[0].available

    async def waiting(self) -> int:
        return (await self.qstore.pump(POOL)).depth

    async def close(self) -> None:
        await self.queue.close()
        if self.kind == "redis":
            await self.client.aclose()


def admit(q: Queues, rid: str, flow: str, buckets: list[BucketSpec], **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        pool=POOL,
        flow=flow,
        weight=1.0,
        deadline=time.time() + 5,
        max_depth=1000,
        flow_depth=1000,
    )
    args.update(kw)
    return q.queue.admit(rid, [load.tenant_bucket(flow), *buckets], Usage(input_tokens=100), **args)


async def loop_lag(stop: asyncio.Event) -> float:
    """The worst lateness of a 10 ms timer on this event loop until ``stop``."""
    worst = 0.0
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.01)
        worst = max(worst, time.perf_counter() - t0 - 0.01)
    return worst


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_it_admits_or_refuses_a_burst_by_each_deadline_and_never_beyond_capacity(kind, prefix):
    async def main() -> None:
        q = Queues(kind, prefix)
        # 1000 tokens/s, 1000 at first; 300 requests of 100 tokens with 0.3–0.6 s deadlines:
        # about 16 can fit. (Real deadlines are spread too: not 75 waiters leaving at once.)
        start = time.time()
        results: list[tuple[float, float, Any]] = []

        async def one(i: int) -> None:
            deadline = time.time() + 0.3 + (i % 31) * 0.01
            r = await admit(q, f"b{i}", f"t{i % 5}", [TPM], deadline=deadline, lease_seconds=60)
            results.append((deadline, time.time(), r))

        stop = asyncio.Event()
        probe = asyncio.create_task(loop_lag(stop))
        await asyncio.gather(*(one(i) for i in range(300)))
        stop.set()
        lag = await probe
        grants = [r for _, _, r in results if isinstance(r, Grant)]
        refusals = [r for _, _, r in results if isinstance(r, QueueRefusal)]
        assert len(grants) + len(refusals) == 300
        assert all(g.created_at < d for d, _, g in results if isinstance(g, Grant))
        # Nobody waits 100 ms past its deadline (beyond the lag of this event loop itself,
        # which a busy machine adds to every timer).
        assert max(done - d for d, done, _ in results) <= 0.1 + lag, lag
        for r in refusals:
            assert r.reason in (QueueReason.DEADLINE, QueueReason.DEADLINE_UNREACHABLE), r
            assert r.retry_at >= r.at and r.queue_id, r
        if grants:
            elapsed = max(g.created_at for g in grants) - start
            assert 100 * len(grants) <= 1000 + 1000 * elapsed + 1e-6  # capacity + refill
        # And the refill was handed out: 100 tokens every 0.1 s over the first deadlines
        # (0.3 s), less what a stalled event loop (lag) let pass unpumped. A loop stalled past
        # the first deadlines leaves nothing to check (CI once granted none: lag beyond 0.3 s).
        if lag < 0.3:
            refills = max(1, 3 - math.ceil(lag / 0.1))
            assert len(grants) >= 10 + refills - 1, (len(grants), lag)
        assert await q.waiting() == 0
        await q.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_it_leaves_nothing_behind_when_waiters_are_cancelled(kind, prefix):
    async def main() -> None:
        q = Queues(kind, prefix)
        holders = [await admit(q, f"h{i}", "a", [SLOTS]) for i in range(2)]
        waiters = [asyncio.create_task(admit(q, f"w{i}", f"t{i % 3}", [SLOTS])) for i in range(40)]
        for _ in range(100):  # all forty have entered the queue (a busy machine is slower)
            if await q.waiting() == 40:
                break
            await asyncio.sleep(0.05)
        assert await q.waiting() == 40
        for task in waiters[::2]:
            task.cancel()
        # A release hands the slot to the next waiter while others are being cancelled.
        await q.queue.release(holders[0])
        await asyncio.gather(*waiters[::2], return_exceptions=True)
        assert all(t.cancelled() for t in waiters[::2])
        await q.queue.release(holders[1])
        # Every waiter that was not cancelled gets a slot in turn and gives it back.
        served = 0
        for task in asyncio.as_completed(waiters[1::2]):
            grant = await task
            assert isinstance(grant, Grant)
            served += 1
            await q.queue.release(grant)
        assert served == 20
        assert await q.waiting() == 0
        assert await q.available(SLOTS) == 2  # no slot held by a cancelled waiter
        if kind == "redis":
            qp = queue_prefix(prefix, POOL)
            sync = redis.Redis.from_url(REDIS_URL)
            assert sync.zcard(f"{qp}:d") == sync.zcard(f"{qp}:h") == sync.zcard(f"{qp}:l") == 0
            assert not [k for k in sync.scan_iter(f"{qp}:f:*")]
            sync.close()
        await q.close()

    asyncio.run(main())


def test_it_wakes_a_waiter_of_a_concurrency_pool_on_release_not_on_lease_expiry(prefix):
    async def main() -> list[float]:
        q = Queues("redis", prefix)
        latencies = []
        for round_ in range(20):
            held = [await admit(q, f"h{round_}-{i}", "a", [SLOTS]) for i in range(2)]
            waiter = asyncio.create_task(admit(q, f"w{round_}", "b", [SLOTS]))
            await asyncio.sleep(0.01)
            assert not waiter.done()
            released = time.time()
            await q.queue.reconcile(held[0], Usage(input_tokens=100))
            grant = await waiter
            latencies.append(time.time() - released)
            assert isinstance(grant, Grant)
            for g in (held[1], grant):
                await q.queue.release(g)
        await q.close()
        return latencies

    latencies = asyncio.run(main())
    # The lease would expire in 30 s; the release itself wakes the waiter.
    assert statistics.median(latencies) < 0.02 and max(latencies) < 0.2, latencies


def _run_processes(
    prefix: str,
    plans: list[list[load.Stream]],
    *,
    buckets: list[BucketSpec],
    seconds: float,
    patience: float,
) -> list[load.Seen]:
    """One spawned gateway process per plan, all starting together."""
    start_at = time.time() + 2.0  # room for the children to start
    args = [(REDIS_URL, prefix, plan, buckets, start_at, seconds, patience) for plan in plans]
    with SPAWN.Pool(len(plans)) as pool:
        return pool.starmap(load.streams_worker, args)


def _granted(seen: list[load.Seen], tenant: str, start: float, end: float) -> int:
    t0 = min(t for s in seen for times in s.arrivals.values() for t in times)
    return sum(start <= t - t0 < end for s in seen for t in s.granted.get(tenant, []))


def test_it_keeps_quiet_tenants_throughput_beside_a_noisy_one_across_processes(prefix):
    """Issue acceptance at store level: A floods at 10× its fair share; B and C keep ≥ 90 %."""
    seconds, warmup = 5.0, 1.0
    quiet = [load.Stream("b", 40.0), load.Stream("c", 40.0, phase=0.0125)]
    # Baseline: B and C alone (the pool, 200 requests/s, is far from full).
    alone = _run_processes(
        prefix, [[quiet[0]], [quiet[1]]], buckets=[load.POOL_TPM], seconds=3.0, patience=2.0
    )
    base = {t: _granted(alone, t, warmup, 3.0) / (3.0 - warmup) for t in ("b", "c")}
    delete_prefix(REDIS_URL, prefix)
    # Fair share is 200/3 ≈ 67 requests/s each; A offers 667/s, from both processes.
    noisy = [load.Stream("a", 333.5), load.Stream("a", 333.5, phase=0.0015)]
    seen = _run_processes(
        prefix,
        [[noisy[0], quiet[0]], [noisy[1], quiet[1]]],
        buckets=[load.POOL_TPM],
        seconds=seconds,
        patience=2.0,
    )
    assert not [e for s in seen for e in s.errors]
    got = {t: _granted(seen, t, warmup, seconds) / (seconds - warmup) for t in "abc"}
    offered = {"a": 667.0, "b": 40.0, "c": 40.0}
    fair = weighted_max_min(200.0, offered, {t: 1.0 for t in "abc"})
    waits = {
        run: {
            t: statistics.quantiles([w for s in seen_ for w in s.waits.get(t, [])], n=100)[98]
            for t in ("b", "c")
        }
        for run, seen_ in (("alone", alone), ("beside A", seen))
    }
    print(f"\nbaseline {base}, with A {got}, max-min fair {fair}, p99 admit wait {waits}")
    for t in ("b", "c"):
        assert got[t] >= 0.9 * base[t], (t, got, base)
    assert jain_index([got[t] / fair[t] for t in "abc"]) >= 0.95, got
    # Nobody waited long past a deadline, and A's excess was refused, not queued forever.
    assert max(x for s in seen for x in s.late) <= 0.1
    assert sum(s.reasons["flow_full"] for s in seen) > 1000


def test_it_shares_one_queue_between_processes_without_exceeding_the_pool(prefix):
    """Four processes, one tenant each, all backlogged on 3 concurrency slots held 30 ms."""
    plans = [[load.Stream(t, 60.0, phase=i * 0.004, hold=0.03)] for i, t in enumerate("wxyz")]
    seen = _run_processes(prefix, plans, buckets=[load.POOL_SLOTS], seconds=3.0, patience=1.5)
    assert not [e for s in seen for e in s.errors]
    events = sorted(
        [(a, 1) for s in seen for a, _ in s.held] + [(b, -1) for s in seen for _, b in s.held]
    )
    in_use = peak = 0
    for _, step in events:
        in_use += step
        peak = max(peak, in_use)
    assert peak <= 3
    counts = [_granted(seen, t, 0.5, 3.0) for t in "wxyz"]
    assert min(counts) > 0 and jain_index(counts) >= 0.95, counts
    # No waiter hears later than a scheduler's hiccup after its deadline: four processes on
    # two cores beside the suite's other worker were seen 0.22 s late (CI), never more.
    assert max(x for s in seen for x in s.late) <= 0.3


def test_it_gives_a_dead_processs_place_in_line_to_a_live_waiter_within_its_mark(prefix):
    """A process is killed (its listener and pump timers stop; it never reads again) with a
    waiter first in line: the next refill after its mark ran out goes to the live process's
    waiter at once, not to the dead one (which would have cost a whole refill period)."""
    period = MAILBOX_ALIVE_SECONDS + 1.5
    one = BucketSpec("alpha-one", POOL, Dimension.REQUESTS, Rule.REFILL, 1, period)

    async def depth(q: Queues, n: int) -> None:
        for _ in range(100):
            if await q.waiting() == n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never {n} waiting")

    async def main() -> None:
        live, dead = Queues("redis", prefix), Queues("redis", prefix)
        waiter: asyncio.Task[Any] | None = None
        try:
            drained = await admit(live, "h", "a", [one])
            assert isinstance(drained, Grant)
            refill = drained.created_at + period
            # Same start tag, smaller id: the dead process's waiter is first in line.
            far = time.time() + 60
            waiter = asyncio.create_task(admit(dead, "A", "t1", [one], deadline=far))
            await depth(live, 1)
            served = asyncio.create_task(admit(live, "B", "t2", [one], deadline=far))
            await depth(live, 2)
            assert dead.queue._listener is not None
            dead.queue._listener.cancel()
            for _, handle in dead.queue._timers.values():
                handle.cancel()
            dead.queue._timers.clear()
            grant = await asyncio.wait_for(served, period + 5)
            assert isinstance(grant, Grant)
            assert refill <= grant.created_at <= refill + 1.0, grant.created_at - refill
            assert await live.waiting() == 0
            # A took nothing: it left the line with an 'abandoned' verdict nobody reads.
            sync = redis.Redis.from_url(REDIS_URL)
            told = [m.split(b"\x1f") for m in sync.lrange(dead.qstore.mailbox, 0, -1)]
            sync.close()
            assert [(m[0], m[1], m[3]) for m in told] == [(b"A", b"Q", b"abandoned")]
            assert not waiter.done()
        finally:
            if waiter is not None:
                waiter.cancel()
                await asyncio.gather(waiter, return_exceptions=True)
            await live.close()
            await dead.close()

    asyncio.run(main())
