"""Allowances on a real Redis (quotas/allowances.py): while a request's buckets have plenty
left, a gateway process reserves for several requests at once and grants them without a Redis
call each; the buckets still end up charged exactly what the requests used, no two processes
ever hand out the same capacity, and a process that dies gives back its slots at its lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from quotas import allowances as allowances_module
from quotas.broker import AttemptBuckets, Broker, Turn
from quotas.core.allowance import MARGIN_SECONDS
from quotas.core.fairqueue import QueueRefusal
from quotas.core.model import BucketSpec, Dimension, Grant, Reason, Rule, Usage, Window
from quotas.snapshot import ScopedBucket
from quotas.store.redis import RedisReservationStore
from tests.quotas.conftest import REDIS_URL

PROVIDER = "provider:theta"
SLOTS = BucketSpec("slots", PROVIDER, Dimension.CONCURRENCY, Rule.CONCURRENCY, 1000)
TOKENS = BucketSpec(
    "tokens", "tenant:acme", Dimension.TOTAL_TOKENS, Rule.FIXED_WINDOW, 1e6, window=Window.DAY
)
DAILY = BucketSpec(
    "daily", "tenant:acme", Dimension.REQUESTS, Rule.FIXED_WINDOW, 1e5, window=Window.DAY
)
DEMAND = Usage(input_tokens=30, output_tokens=100)
SIZE = 8


def attempt(*specs: BucketSpec) -> AttemptBuckets:
    return AttemptBuckets(tuple(ScopedBucket(s, "tenant") for s in specs), PROVIDER)


def turn() -> Turn:
    return Turn(flow="acme", weight=1.0, deadline=1e12, max_depth=100, flow_depth=100)


class CountingStore(RedisReservationStore):
    """Counts the broker's calls to Redis (the fair queue's admit and settle included)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    async def call_specs(self, name: str, *args: Any) -> Any:
        self.calls.append(name)
        return await super().call_specs(name, *args)


def run(
    prefix: str, scenario: Callable[..., Awaitable[Any]], *, lease: float = 30.0, size: int = SIZE
) -> Any:
    async def main() -> Any:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        store = CountingStore(client, prefix=prefix, lease_seconds=lease)
        broker = Broker(store, allowance_requests=size)
        try:
            return await scenario(broker, store)
        finally:
            await client.aclose()

    return asyncio.run(main())


async def taken_after_first(broker: Broker, buckets: AttemptBuckets) -> Grant:
    """One request reserves on its own and shows the room; the allowance follows."""
    first = await broker.admit("r-0", buckets, DEMAND, turn())
    assert isinstance(first, Grant)
    for _ in range(100):
        if broker.allowances is not None and broker.allowances._current:
            break
        await asyncio.sleep(0.01)
    return first


async def levels(store: RedisReservationStore, *specs: BucketSpec) -> dict[str, float]:
    return {level.bucket: level.available for level in await store.levels(list(specs))}


def test_a_set_with_plenty_left_is_granted_from_the_allowance_and_charged_what_it_used(
    prefix: str,
) -> None:
    buckets = attempt(SLOTS, TOKENS, DAILY)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        first = await taken_after_first(broker, buckets)
        assert store.calls == ["queue_admit", "queue_admit"]  # the request, the allowance
        grants = [await broker.admit(f"r-{i}", buckets, DEMAND, turn()) for i in range(1, 9)]
        assert all(isinstance(g, Grant) for g in grants)
        assert store.calls == ["queue_admit", "queue_admit"]  # the next 8: no Redis call
        # While they run, Redis shows the allowance's 8 slots and the first request's.
        assert (await levels(store, SLOTS))["slots"] == 1000 - 9
        used = Usage(input_tokens=30, output_tokens=12)
        await broker.reconcile(first, used)
        for grant in grants:
            assert isinstance(grant, Grant)
            await broker.reconcile(grant, used)
        assert broker.allowances is not None
        await broker.allowances.close()
        after = await levels(store, SLOTS, TOKENS, DAILY)
        # As if each of the 9 had reserved and settled on its own.
        assert after == {"slots": 1000, "tokens": 1e6 - 9 * 42, "daily": 1e5 - 9}

    run(prefix, scenario)


def test_a_request_the_allowance_cannot_cover_reserves_on_its_own(prefix: str) -> None:
    buckets = attempt(SLOTS, TOKENS, DAILY)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        await taken_after_first(broker, buckets)
        calls = len(store.calls)
        large = Usage(input_tokens=30, output_tokens=3000)  # more than 8 × 2 × 130 tokens
        grant = await broker.admit("large", buckets, large, turn())
        assert isinstance(grant, Grant)
        assert store.calls[calls:] == ["queue_admit"]  # the allowance stays for the others
        assert broker.allowances is not None and not broker.allowances.owns(grant)
        small = await broker.admit("small", buckets, DEMAND, turn())
        assert isinstance(small, Grant) and broker.allowances.owns(small)

    run(prefix, scenario)


def test_no_allowance_is_taken_while_a_bucket_is_short(prefix: str) -> None:
    """Two more slots would leave fewer than half of 4: every request reserves on its own."""
    few = BucketSpec("few-slots", PROVIDER, Dimension.CONCURRENCY, Rule.CONCURRENCY, 4)
    buckets = attempt(few, TOKENS)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        for i in range(3):
            grant = await broker.admit(f"r-{i}", buckets, DEMAND, turn())
            assert isinstance(grant, Grant)
            await asyncio.sleep(0.02)
        assert store.calls == ["queue_admit"] * 3

    run(prefix, scenario)


def test_two_processes_never_grant_more_than_a_bucket_holds(prefix: str) -> None:
    """Two brokers (two processes' worth) take allowances and grant without settling until
    refused: together they granted exactly the 60 slots, never more."""
    sixty = BucketSpec("sixty", PROVIDER, Dimension.CONCURRENCY, Rule.CONCURRENCY, 60)
    buckets = attempt(sixty, TOKENS)

    async def main() -> tuple[int, int]:
        clients = [redis.asyncio.Redis.from_url(REDIS_URL) for _ in range(2)]
        brokers = [
            Broker(RedisReservationStore(c, prefix=prefix), allowance_requests=8) for c in clients
        ]
        no_wait = Turn(flow="acme", weight=1.0, deadline=1e12, max_depth=0, flow_depth=0)
        granted = local = 0
        for n in range(200):
            broker = brokers[n % 2]
            grant = await broker.admit(f"r-{n}", buckets, DEMAND, no_wait)
            if isinstance(grant, Grant):
                granted += 1
                local += broker.allowances is not None and broker.allowances.owns(grant)
            await asyncio.sleep(0.002)  # let the allowances be taken in the background
        for c in clients:
            await c.aclose()
        return granted, local

    granted, local = asyncio.run(main())
    assert granted <= 60
    assert local >= 16  # each took at least one allowance (of 8) while half was left


def test_a_pause_stops_the_providers_allowances_at_once(prefix: str) -> None:
    buckets = attempt(SLOTS, TOKENS)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        await taken_after_first(broker, buckets)
        await broker.pause_provider(buckets, retry_after=5.0, now=time.time())
        calls = len(store.calls)
        no_wait = Turn(flow="acme", weight=1.0, deadline=1e12, max_depth=0, flow_depth=0)
        result = await broker.admit("after-429", buckets, DEMAND, no_wait)
        assert not isinstance(result, Grant)  # the paused account refuses: no allowance
        assert len(store.calls) == calls + 1

    run(prefix, scenario)


@pytest.mark.timeout(30)
def test_a_process_that_dies_leaves_its_allowance_to_its_lease(prefix: str) -> None:
    """Its slots come back when the lease runs out (reaped); what it took stays counted."""
    buckets = attempt(SLOTS, DAILY)

    async def died(broker: Broker, store: CountingStore) -> None:
        await taken_after_first(broker, buckets)
        # The process ends here: its allowance is neither settled nor renewed any more.

    run(prefix, died, lease=1.0)

    async def afterwards(broker: Broker, store: CountingStore) -> dict[str, float]:
        while_held = await levels(store, SLOTS, DAILY)
        await asyncio.sleep(1.2)
        await store.reap()
        return {"while held": while_held, "reaped": await levels(store, SLOTS, DAILY)}

    seen = run(prefix, afterwards)
    assert seen["while held"] == {"slots": 1000 - 1 - SIZE, "daily": 1e5 - 1 - SIZE}
    assert seen["reaped"] == {"slots": 1000, "daily": 1e5 - 1 - SIZE}


def test_an_allowance_grants_for_a_second_at_most(prefix: str, monkeypatch: Any) -> None:
    """Then it is reconciled and the next request reserves on its own again (and shows the
    room for the next allowance)."""
    monkeypatch.setattr(allowances_module, "MAX_AGE", 0.2)
    buckets = attempt(SLOTS, TOKENS)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        first = await taken_after_first(broker, buckets)
        await broker.reconcile(first, DEMAND)
        await asyncio.sleep(0.4)
        assert store.calls[-1] == "queue_settle"  # the allowance, reconciled
        assert (await levels(store, SLOTS))["slots"] == 1000
        calls = len(store.calls)
        grant = await broker.admit("later", buckets, DEMAND, turn())
        assert isinstance(grant, Grant)
        assert store.calls[calls] == "queue_admit"

    run(prefix, scenario)


async def steady(broker: Broker, buckets: AttemptBuckets, count: int, gap: float) -> list[bool]:
    """``count`` requests of one set, one every ``gap`` seconds, each settled at once: which
    of them were granted from an allowance."""
    assert broker.allowances is not None
    from_allowance = []
    for i in range(count):
        grant = await broker.admit(f"s-{i}", buckets, DEMAND, turn())
        assert isinstance(grant, Grant)
        from_allowance.append(broker.allowances.owns(grant))
        await broker.reconcile(grant, DEMAND)
        await asyncio.sleep(gap)
    return from_allowance


def test_the_next_allowance_is_taken_while_a_quarter_of_the_current_one_is_left(
    prefix: str,
) -> None:
    """Not once it is spent: requests that come meanwhile would each reserve on their own.
    The buckets still end as if each request had reserved alone."""
    buckets = attempt(SLOTS, TOKENS, DAILY)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        first = await taken_after_first(broker, buckets)
        await broker.reconcile(first, DEMAND)
        admits = store.calls.count("queue_admit")  # the request's and the allowance's
        grants = [await broker.admit(f"r-{i}", buckets, DEMAND, turn()) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        assert store.calls.count("queue_admit") == admits  # 3 of 8 left: not yet
        grants.append(await broker.admit("r-6", buckets, DEMAND, turn()))  # 2 of 8 left
        await asyncio.sleep(0.05)
        assert store.calls.count("queue_admit") == admits + 1  # the next one
        assert broker.allowances is not None
        assert all(isinstance(g, Grant) and broker.allowances.owns(g) for g in grants)
        for grant in grants:
            assert isinstance(grant, Grant)
            await broker.reconcile(grant, DEMAND)
        later = await steady(broker, buckets, 20, 0.005)
        assert later == [True] * 20
        await broker.allowances.close()
        assert await levels(store, SLOTS, TOKENS, DAILY) == {
            "slots": 1000,
            "tokens": 1e6 - 27 * 130,
            "daily": 1e5 - 27,
        }

    run(prefix, scenario)


def test_a_used_allowance_takes_the_next_one_shortly_before_its_time_is_up(
    prefix: str, monkeypatch: Any
) -> None:
    """At a few requests a second none may come near its end to ask for the next: the one
    that granted a request takes it then. An allowance that granted none takes no next one."""
    monkeypatch.setattr(allowances_module, "MAX_AGE", 0.2)
    buckets = attempt(SLOTS, TOKENS)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        granted = await steady(broker, buckets, 10, 0.12)
        assert granted == [False] + [True] * 9
        await asyncio.sleep(0.5)  # the last one grants nothing and ends: no next one
        assert broker.allowances is not None
        assert not broker.allowances._current and not broker.allowances._taking
        assert (await levels(store, SLOTS))["slots"] == 1000

    run(prefix, scenario, size=64)


def test_an_allowance_that_comes_after_a_429_stopped_its_account_gives_everything_back(
    prefix: str,
) -> None:
    """Taken before the pause reached Redis, it arrives after the 429 retired the account's
    allowances: it grants nothing, and its slots are back at once."""
    buckets = attempt(SLOTS, TOKENS)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        assert broker.allowances is not None
        allowances = broker.allowances
        gate = asyncio.Event()
        real_take = broker.allowance_take

        async def slow_take(*args: Any) -> Any:
            await gate.wait()
            return await real_take(*args)

        broker.allowance_take = slow_take  # type: ignore[method-assign]
        first = await broker.admit("r-0", buckets, DEMAND, turn())
        assert isinstance(first, Grant)
        await broker.reconcile(first, DEMAND)
        await asyncio.sleep(0.01)
        assert allowances._taking  # on its way
        allowances.retire_scope(PROVIDER)  # the 429
        gate.set()
        for _ in range(50):  # well within the allowance's second
            if not allowances._taking:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not allowances._current
        assert store.calls[-2:] == ["queue_admit", "queue_settle"]  # taken, given back
        assert (await levels(store, SLOTS))["slots"] == 1000
        second = await broker.admit("r-1", buckets, DEMAND, turn())
        assert isinstance(second, Grant) and not allowances.owns(second)

    run(prefix, scenario)


async def look(broker: Broker) -> None:
    """What a heartbeat does for the allowances (``quotas.recovery``): read Redis's pause count."""
    assert broker.allowances is not None and isinstance(broker.store, RedisReservationStore)
    state = await broker.store.recovery_look()
    broker.allowances.watch(state.pauses, time.time())


def test_while_a_heartbeat_watches_for_pauses_an_allowance_grants_past_max_age(
    prefix: str, monkeypatch: Any
) -> None:
    """A pause set elsewhere reaches the process at its next look, so the allowance need not
    end at MAX_AGE: it grants until WATCHED_MAX_AGE, without a Redis call."""
    monkeypatch.setattr(allowances_module, "MAX_AGE", 0.2)
    monkeypatch.setattr(allowances_module, "WATCHED_MAX_AGE", 2.0)
    buckets = attempt(SLOTS, TOKENS)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        await look(broker)
        await taken_after_first(broker, buckets)
        calls = len(store.calls)
        for i in range(3):
            await asyncio.sleep(0.15)
            await look(broker)
            grant = await broker.admit(f"r-{i}", buckets, DEMAND, turn())
            assert isinstance(grant, Grant)
            assert broker.allowances is not None and broker.allowances.owns(grant)
        assert store.calls[calls:] == []  # 0.45 s after it was taken: still no Redis call

    run(prefix, scenario)


def test_a_pause_another_process_sets_stops_the_allowances_at_the_next_look(
    prefix: str, monkeypatch: Any
) -> None:
    """Process A grants from its allowance; process B gets a 429 and pauses the account.
    A reads the pause count at its next heartbeat: its allowances grant no more, its next
    request reserves on its own and is refused, and its allowance's slots come back."""
    monkeypatch.setattr(allowances_module, "WATCHED_MAX_AGE", 30.0)
    buckets = attempt(SLOTS, TOKENS)

    async def main() -> None:
        clients = [redis.asyncio.Redis.from_url(REDIS_URL) for _ in range(2)]
        a, b = (
            Broker(RedisReservationStore(c, prefix=prefix), allowance_requests=SIZE)
            for c in clients
        )
        try:
            await look(a)
            first = await taken_after_first(a, buckets)
            await a.reconcile(first, DEMAND)
            await b.pause_provider(buckets, retry_after=5.0, now=time.time())
            before = await a.admit("before-the-look", buckets, DEMAND, turn())
            assert isinstance(before, Grant) and a.allowances is not None
            assert a.allowances.owns(before)  # A has not looked yet
            await a.reconcile(before, DEMAND)
            await look(a)
            no_wait = Turn(flow="acme", weight=1.0, deadline=1e12, max_depth=0, flow_depth=0)
            after = await a.admit("after-the-look", buckets, DEMAND, no_wait)
            assert isinstance(after, QueueRefusal) and after.reason is Reason.PAUSED
            await asyncio.sleep(0.05)  # the retired allowance is reconciled
            assert (await levels(a.store, SLOTS))["slots"] == 1000
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(main())


def test_when_the_heartbeat_stops_looking_allowances_end_after_max_age(
    prefix: str, monkeypatch: Any
) -> None:
    """A pause set elsewhere would go unseen: the process falls back to MAX_AGE."""
    monkeypatch.setattr(allowances_module, "MAX_AGE", 0.2)
    monkeypatch.setattr(allowances_module, "WATCHED_MAX_AGE", 30.0)
    monkeypatch.setattr(allowances_module, "STALE_AFTER", 0.3)
    buckets = attempt(SLOTS, TOKENS)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        await look(broker)
        first = await taken_after_first(broker, buckets)
        await broker.reconcile(first, DEMAND)
        await asyncio.sleep(0.4)  # no look since: past STALE_AFTER and MAX_AGE
        calls = len(store.calls)
        grant = await broker.admit("unwatched", buckets, DEMAND, turn())
        assert isinstance(grant, Grant)
        assert broker.allowances is not None and not broker.allowances.owns(grant)
        assert "queue_admit" in store.calls[calls:]  # beside the retired one's reconcile

    run(prefix, scenario)


def test_an_allowance_whose_set_goes_quiet_gives_back_what_it_holds(
    prefix: str, monkeypatch: Any
) -> None:
    """Watched, it could grant for WATCHED_MAX_AGE; when no request comes for IDLE_AFTER it
    ends then, and is reconciled: the slots it held are back, not held for the rest of it."""
    monkeypatch.setattr(allowances_module, "WATCHED_MAX_AGE", 30.0)
    monkeypatch.setattr(allowances_module, "IDLE_AFTER", 0.3)
    buckets = attempt(SLOTS, TOKENS)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        await look(broker)
        first = await taken_after_first(broker, buckets)
        await broker.reconcile(first, DEMAND)
        for i in range(3):  # a request every 0.2 s keeps it
            grant = await broker.admit(f"r-{i}", buckets, DEMAND, turn())
            assert broker.allowances is not None and broker.allowances.owns(grant)
            await broker.reconcile(grant, DEMAND)
            await asyncio.sleep(0.2)
            await look(broker)
        assert (await levels(store, SLOTS))["slots"] == 1000 - SIZE  # still held
        await asyncio.sleep(0.3)  # quiet for 0.5 s since the last request
        assert not broker.allowances._current
        assert (await levels(store, SLOTS))["slots"] == 1000

    run(prefix, scenario)


def test_a_request_that_leaves_a_shared_bucket_short_stops_the_allowances_on_it(
    prefix: str,
) -> None:
    """Set A's allowance and set B share the app's 20 slots. B's requests reserve on their own
    and hold them; once one leaves fewer than half, A's allowance grants no more: A's next
    request reserves on its own, in fair turn with B's."""
    shared = BucketSpec("app-slots", "app:acme/web", Dimension.CONCURRENCY, Rule.CONCURRENCY, 20)
    set_a, set_b = attempt(shared, TOKENS), attempt(shared, DAILY)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        assert broker.allowances is not None
        first = await taken_after_first(broker, set_a)
        await broker.reconcile(first, DEMAND)
        from_a = await broker.admit("a-1", set_a, DEMAND, turn())
        assert broker.allowances.owns(from_a)  # A's allowance: 2 slots (a tenth of 20)
        for i in range(10):  # held: with A's 2, the last ones leave fewer than 10 free
            assert isinstance(await broker.admit(f"b-{i}", set_b, DEMAND, turn()), Grant)
            await asyncio.sleep(0.01)  # B takes an allowance of its own too, at first
        assert (await levels(store, shared))["app-slots"] < 10
        assert not broker.allowances._current  # neither A's nor B's grants any more
        later = await broker.admit("a-2", set_a, DEMAND, turn())
        assert isinstance(later, Grant) and not broker.allowances.owns(later)

    run(prefix, scenario, size=2)


def test_a_refused_request_stops_the_allowances_on_its_buckets(prefix: str) -> None:
    shared = BucketSpec("app-slots", "app:acme/web", Dimension.CONCURRENCY, Rule.CONCURRENCY, 20)
    one = BucketSpec("one", "api_key:7", Dimension.CONCURRENCY, Rule.CONCURRENCY, 1)
    set_a, set_b = attempt(shared, TOKENS), attempt(shared, one)
    no_wait = Turn(flow="acme", weight=1.0, deadline=1e12, max_depth=0, flow_depth=0)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        assert broker.allowances is not None
        await taken_after_first(broker, set_a)
        assert isinstance(await broker.admit("b-0", set_b, DEMAND, no_wait), Grant)
        assert broker.allowances._current  # one slot of 20 taken: plenty left
        refused = await broker.admit("b-1", set_b, DEMAND, no_wait)
        assert isinstance(refused, QueueRefusal)
        assert not broker.allowances._current

    run(prefix, scenario, size=2)


def test_no_allowance_is_taken_as_a_slice_ends_and_one_is_taken_in_the_next(
    prefix: str,
) -> None:
    """An allowance could grant only until its rolling window's slice ends (less a margin):
    one taken closer to that than MIN_LIFE would cost its take and reconcile for next to
    nothing, and each request it turned away would ask for another (a storm of them before
    every 5-minute slice end of a 5-hour window, bench/results/redis.md)."""
    width = 3.0
    rolling = BucketSpec(
        "rolling", "tenant:acme", Dimension.REQUESTS, Rule.ROLLING_WINDOW, 1e5,
        period=2 * width, slices=2,
    )  # fmt: skip
    buckets = attempt(SLOTS, rolling)

    async def scenario(broker: Broker, store: CountingStore) -> None:
        end = (time.time() // width + 1) * width
        if end - time.time() < 1.0:  # too close to time the next steps: the slice after
            end += width
        # Less than MIN_LIFE before the slice's last moment an allowance could grant in.
        await asyncio.sleep(end - MARGIN_SECONDS - 0.1 - time.time())
        for i in range(3):
            grant = await broker.admit(f"late-{i}", buckets, DEMAND, turn())
            assert isinstance(grant, Grant)
            await broker.reconcile(grant, DEMAND)
        await asyncio.sleep(0.05)
        assert store.calls == ["queue_admit", "queue_settle"] * 3  # each on its own, no take
        await asyncio.sleep(end + 0.05 - time.time())  # the next slice
        await taken_after_first(broker, buckets)
        assert store.calls[6:] == ["queue_admit", "queue_admit"]  # the request, the allowance
        assert broker.allowances is not None and broker.allowances._current

    run(prefix, scenario)
