"""Worker processes for the atomicity, crash and restart tests (imported by spawned children).

Each worker runs many concurrent reservations (asyncio) through the real Redis script and
returns what it saw, in server time, so the parent can check invariants across processes.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from quotas.core.model import BucketSpec, Dimension, Grant, Rule, Usage, Window
from quotas.store.redis import RedisReservationStore

CONC = BucketSpec("conc", "provider:alpha", Dimension.CONCURRENCY, Rule.CONCURRENCY, 10)
# A refill this slow barely refills during a test: what is taken stays visible, and it binds.
RPM = BucketSpec("rpm", "provider:alpha", Dimension.REQUESTS, Rule.REFILL, 200, 1e7)
DAY = BucketSpec(
    "day",
    "tenant:acme",
    Dimension.INPUT_TOKENS,
    Rule.FIXED_WINDOW,
    10_000_000,
    window=Window.DAY,
    timezone="America/Los_Angeles",
)
SPEND = BucketSpec("spend", "tenant:acme", Dimension.SPEND, Rule.ROLLING_WINDOW, 1e6, 86400)
MIXED = [CONC, DAY, SPEND, RPM]
FAST_RPM = BucketSpec("rpm-fast", "provider:alpha", Dimension.REQUESTS, Rule.REFILL, 2000, 2.0)


@dataclass
class Seen:
    """What one worker observed; times are the Redis server's."""

    intervals: list[tuple[float, float]] = field(default_factory=list)  # concurrency held
    grants_at: list[float] = field(default_factory=list)  # a request taken from rpm
    releases_at: list[float] = field(default_factory=list)  # a request given back to rpm
    granted: int = 0
    released_requests: int = 0
    charged_tokens: float = 0.0  # what the windows must end up holding
    charged_spend: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    adopted: int = 0


def _store(url: str, prefix: str, lease: float) -> RedisReservationStore:
    client = redis.asyncio.Redis.from_url(url)
    return RedisReservationStore(client, prefix=prefix, lease_seconds=lease)


async def _mixed(url: str, prefix: str, seconds: float, tasks: int, seed: int) -> Seen:
    """``seconds`` of load, and on (up to 4 × longer) until rpm has refused this worker once:
    on a busy machine 3 s may not be enough to use the bucket up, and the test needs it used up."""
    store = _store(url, prefix, lease=1.0)
    seen = Seen()
    rng = random.Random(seed)
    stop = time.monotonic() + seconds
    hard_stop = stop + 4 * seconds
    exhausted = False

    def going() -> bool:
        now = time.monotonic()
        return now < stop or (not exhausted and now < hard_stop)

    async def client(n: int) -> None:
        nonlocal exhausted
        i = 0
        while going():
            i += 1
            rid = f"{seed}-{n}-{i}"
            result = await store.reserve(rid, MIXED, Usage(input_tokens=100, spend=1.0))
            if not isinstance(result, Grant):
                seen.reasons[result.reason] = seen.reasons.get(result.reason, 0) + 1
                exhausted = exhausted or any(r.bucket == RPM.name for r in result.refusals)
                await asyncio.sleep(rng.uniform(0, 0.005))
                continue
            seen.granted += 1
            seen.grants_at.append(result.created_at)
            await asyncio.sleep(rng.uniform(0, 0.02))
            roll = rng.random()
            if roll < 0.02:  # abandoned: the lease expires and its slot goes back
                seen.intervals.append((result.created_at, result.expires_at))
                seen.charged_tokens += 100
                seen.charged_spend += 1.0
            elif roll < 0.22:
                done = await store.release(result)
                seen.intervals.append((result.created_at, done.at))
                seen.released_requests += 1
                seen.releases_at.append(done.at)
            else:
                tokens, spend = float(rng.randint(0, 200)), rng.randint(0, 200) / 100
                done = await store.reconcile(result, Usage(input_tokens=tokens, spend=spend))
                seen.intervals.append((result.created_at, done.at))
                seen.charged_tokens += tokens
                seen.charged_spend += spend

    await asyncio.gather(*(client(n) for n in range(tasks)))
    await store.client.aclose()
    return seen


def mixed_worker(url: str, prefix: str, seconds: float, tasks: int, seed: int) -> Seen:
    return asyncio.run(_mixed(url, prefix, seconds, tasks, seed))


async def _burst(url: str, prefix: str, rid_of: str, tasks: int) -> list[tuple[str, float]]:
    store = _store(url, prefix, lease=60.0)
    out: list[tuple[str, float]] = []

    async def one(n: int) -> None:
        rid = rid_of if rid_of else f"{os.getpid()}-{n}"
        result = await store.reserve(rid, [CONC, RPM], Usage())
        out.append(
            (
                "G" if isinstance(result, Grant) else "R",
                result.created_at if isinstance(result, Grant) else result.at,
            )
        )

    await asyncio.gather(*(one(n) for n in range(tasks)))
    await store.client.aclose()
    return out


def burst_worker(url: str, prefix: str, rid: str, tasks: int) -> list[tuple[str, float]]:
    """All tasks reserve at once; with ``rid`` set they all use that one reservation id."""
    return asyncio.run(_burst(url, prefix, rid, tasks))


async def _hold_and_hang(url: str, prefix: str, slots: int, ready_path: str) -> None:
    store = _store(url, prefix, lease=1.0)
    for n in range(slots):
        result = await store.reserve(f"doomed-{n}", [CONC], Usage())
        assert isinstance(result, Grant)
    with open(ready_path, "w") as f:
        f.write("ready")
    await asyncio.sleep(3600)  # holding its slots until the parent SIGKILLs it


def hold_and_hang(url: str, prefix: str, slots: int, ready_path: str) -> None:
    asyncio.run(_hold_and_hang(url, prefix, slots, ready_path))


async def _churn(
    url: str, prefix: str, after_flush: float, tasks: int, seed: int, ready: Any
) -> Seen:
    """Short requests plus a few streams that renew their lease, while Redis may lose state.

    Puts ``seed`` on ``ready`` once it holds a grant, so the test flushes only while every
    worker is busy (spawning is slow on a loaded machine), and goes on ``after_flush`` seconds
    past the first "recovering" refusal it meets (at most ``CHURN_LIMIT`` in all)."""
    store = _store(url, prefix, lease=1.0)
    seen = Seen()
    rng = random.Random(seed)
    stop = time.monotonic() + CHURN_LIMIT
    announced = False

    async def client(n: int) -> None:
        nonlocal stop, announced
        i = 0
        while time.monotonic() < stop:
            i += 1
            try:
                result = await store.reserve(f"{seed}-{n}-{i}", [CONC, FAST_RPM], Usage())
                if not isinstance(result, Grant):
                    if result.reason == "recovering" and "recovering" not in seen.reasons:
                        stop = min(stop, time.monotonic() + after_flush)
                    seen.reasons[result.reason] = seen.reasons.get(result.reason, 0) + 1
                    await asyncio.sleep(rng.uniform(0.001, 0.01))
                    continue
                if not announced:
                    announced = True
                    ready.put(seed)
                if n % 10 == 0:  # a stream: 2.5 s, renewing every 0.3 s
                    end = time.monotonic() + 2.5
                    while time.monotonic() < end:
                        await asyncio.sleep(0.3)
                        renewed = await store.renew(result)
                        seen.adopted += renewed.outcome == "adopted"
                else:
                    await asyncio.sleep(rng.uniform(0.02, 0.3))
                done = await store.release(result)
                seen.intervals.append((result.created_at, done.at))
            except Exception as exc:  # every error counts: none is expected
                seen.errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(client(n) for n in range(tasks)))
    await store.client.aclose()
    return seen


CHURN_LIMIT = 30.0  # seconds: a worker that never sees the flush still ends


def churn_worker(
    url: str, prefix: str, after_flush: float, tasks: int, seed: int, ready: Any
) -> Seen:
    return asyncio.run(_churn(url, prefix, after_flush, tasks, seed, ready))


def most_in_use(takes: list[float], gives: list[float]) -> int:
    """The largest net amount taken at any instant (a give at the same instant counts first)."""
    events = sorted([(t, 0) for t in gives] + [(t, 1) for t in takes])
    in_use = best = 0
    for _, kind in events:
        in_use += 1 if kind else -1
        best = max(best, in_use)
    return best


def peak(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at once; an end at the same instant as a start counts first."""
    events = sorted([(end, 0) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    open_now = best = 0
    for _, kind in events:
        open_now += 1 if kind else -1
        best = max(best, open_now)
    return best
