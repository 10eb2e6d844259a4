"""An answer's ledger records ride in its settle's round trip (issue 19): the settle script
appends them, completing the reservation record with the settle's outcome and settlements, so
the answer's commit (I2) has nothing left to append; what the settle cannot carry waits for
the next append as before."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from typing import Any

import pytest

from common import redis as sy_redis
from gateway import ledger
from gateway.ledger import CARRIED, LedgerBuffer, ledger_flush, record_decode
from gateway.models import Generation
from gateway.records import reservation_settled
from quotas.core.model import BucketSpec, Dimension, Grant, Outcome, Rule, Usage
from quotas.core.queuebook import QueueBook
from quotas.models import Reservation
from quotas.queue import BrokerQueue
from quotas.store.memory import MemoryReservationStore
from quotas.store.queue_memory import MemoryQueueStore
from quotas.store.queue_redis import RedisQueueStore
from quotas.store.redis import RedisReservationStore

POOL = "provider:carry"
BUCKETS = [
    BucketSpec("carry:slots", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 10),
    BucketSpec("carry:out", POOL, Dimension.OUTPUT_TOKENS, Rule.REFILL, 1e6, 60),
    BucketSpec("carry:spend", "tenant:carry", Dimension.SPEND, Rule.ROLLING_WINDOW, 100.0, 3600),
]
DEMAND = Usage(requests=1, input_tokens=100, output_tokens=200, spend=0.02, concurrency=1)
ACTUAL = Usage(requests=1, input_tokens=100, output_tokens=50, spend=0.005)


def _reservation(rid: str) -> dict[str, Any]:
    return {"id": rid, "request_id": "gen-carry", "created_at": time.time(), "tenant_id": 1,
            "taken": {"carry:out": 200.0}, "estimated_spend": 0.02}  # fmt: skip


def _generation(ident: str) -> dict[str, Any]:
    return {"kind": "generation", "id": ident, "created_at": time.time(), "tenant_id": 1,
            "app_id": 1, "status": 200}  # fmt: skip


async def _admit(queue: BrokerQueue, rid: str) -> Grant:
    grant = await queue.admit(
        rid, BUCKETS, DEMAND, pool=POOL, flow="1/interactive", weight=1.0,
        deadline=time.time() + 10, max_depth=0, flow_depth=0,
    )  # fmt: skip
    assert isinstance(grant, Grant), grant
    return grant


@pytest.mark.django_db
def test_an_answers_records_ride_in_its_settle_and_are_stored_with_its_settlement(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sy_redis, "_async_client", None)
    appends: list[int] = []
    real_append = ledger._append

    async def counted(batch: list[bytes], writes: Any = ()) -> bytes:
        appends.append(len(batch))
        return await real_append(batch, writes)

    monkeypatch.setattr(ledger, "_append", counted)
    buffer = LedgerBuffer()
    pin = sy_redis.key("pin", "carry")

    async def main() -> tuple[Any, list[bytes], bytes | None]:
        client = sy_redis.async_client()
        try:
            store = RedisReservationStore(client, prefix=f"{redis_prefix}:q")
            await store.bootstrap()
            queue = BrokerQueue(RedisQueueStore(store))
            grant = await _admit(queue, "carry:1")
            buffer.write(pin, b"endpoint-7", 60_000)  # a conversation's pin, waiting
            carry = buffer.carry(_reservation("carry:1"), [_generation("gen-carry")])
            result = await queue.reconcile(grant, ACTUAL, pool=POOL, carry=carry)
            await buffer.carried(carry, _reservation("carry:1") | reservation_settled(result))
            await buffer.committed()  # nothing of this answer is left to append
            queued = await client.lrange(sy_redis.key("ledger"), 0, -1)
            await queue.close()
            return result, queued, await client.get(pin)
        finally:
            await client.aclose()

    result, queued, pinned = asyncio.run(main())

    assert appends == [] or all(n == 0 for n in appends)  # no append of its own
    assert pinned == b"endpoint-7"
    assert result.outcome is Outcome.RECONCILED
    assert [item[:1] for item in queued] == [CARRIED, ledger.ZSTD_PRIMED]
    reservation = record_decode(queued[0])
    assert reservation["outcome"] == "reconciled"
    # the settlement as the settle computed it, number for number
    assert reservation["settled"] == {
        s.bucket: {"released": s.released, "charged": s.charged} for s in result.settlements
    }
    assert reservation["settled"]["carry:out"] == {"released": 150.0, "charged": 0.0}
    # what this process keeps in case Redis loses it before the flush: the same records
    kept = buffer.kept()
    assert [record_decode(item) for item in kept] == [record_decode(item) for item in queued]
    assert ledger_flush() == 2
    row = Reservation.objects.get(id="carry:1")
    assert row.outcome == "reconciled" and row.settled["carry:out"]["released"] == 150.0
    assert row.estimated_spend == Decimal("0.02")
    assert Generation.objects.filter(id="gen-carry").exists()


@pytest.mark.django_db
def test_a_settle_that_cannot_carry_leaves_the_records_to_the_next_append(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-memory store has no ledger: the answer's records, the whole reservation record
    and the pin go with the next append, which the answer's commit waits for."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    buffer = LedgerBuffer()
    pin = sy_redis.key("pin", "uncarried")

    async def main() -> list[bytes]:
        client = sy_redis.async_client()
        try:
            memory = MemoryReservationStore(clock=time.time)
            queue = BrokerQueue(MemoryQueueStore(QueueBook(memory.book), clock=time.time))
            grant = await _admit(queue, "mem:1")
            buffer.write(pin, b"endpoint-8", 60_000)
            carry = buffer.carry(_reservation("mem:1"), [_generation("gen-mem")])
            result = await queue.reconcile(grant, ACTUAL, pool=POOL, carry=carry)
            assert carry.born is None
            await buffer.carried(carry, _reservation("mem:1") | {"outcome": "reconciled"})
            assert await client.llen(sy_redis.key("ledger")) == 0
            await buffer.committed()
            assert result.outcome is Outcome.RECONCILED
            assert await client.get(pin) == b"endpoint-8"
            return await client.lrange(sy_redis.key("ledger"), 0, -1)
        finally:
            await client.aclose()

    queued = asyncio.run(main())

    assert sorted(record_decode(item)["id"] for item in queued) == ["gen-mem", "mem:1"]
    assert ledger_flush() == 2
    assert Reservation.objects.get(id="mem:1").outcome == "reconciled"


@pytest.mark.django_db
def test_what_it_keeps_of_a_steady_stream_of_carried_answers_is_only_the_last_seconds(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Each answer writes a pin, which arms the batch timer, and its settle takes the pin: no
    append of its own ever runs under a steady load, and what the process keeps in case Redis
    restarts empty must still be let go after LEDGER_RETAIN_SECONDS (it was kept for the whole
    run: peak RSS per worker grew with the run's length)."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    settings.LEDGER_RETAIN_SECONDS = 0.3
    buffer = LedgerBuffer()

    async def main() -> list[dict[str, Any]]:
        client = sy_redis.async_client()
        try:
            store = RedisReservationStore(client, prefix=f"{redis_prefix}:q")
            await store.bootstrap()
            queue = BrokerQueue(RedisQueueStore(store))
            for n in range(30):
                grant = await _admit(queue, f"steady:{n}")
                buffer.write(sy_redis.key("pin", "steady"), str(n).encode(), 60_000)
                carry = buffer.carry(_reservation(f"steady:{n}"), [_generation(f"gen-{n}")])
                result = await queue.reconcile(grant, ACTUAL, pool=POOL, carry=carry)
                await buffer.carried(
                    carry, _reservation(f"steady:{n}") | reservation_settled(result)
                )
                await asyncio.sleep(0.03)
            await queue.close()
            return [record_decode(item) for item in buffer.kept()]
        finally:
            await client.aclose()

    started = time.time()
    kept = asyncio.run(main())
    took = time.time() - started

    assert took > 0.9  # 30 answers over about a second
    reservations = [int(r["id"].split(":")[1]) for r in kept if r["kind"] == "reservation"]
    # the last ~0.3 s of answers (10 at 30 ms each, give or take a slice), not all 30
    assert 3 <= len(reservations) <= 16, reservations
    assert reservations == sorted(reservations) and reservations[-1] == 29
    assert {r["id"] for r in kept if r["kind"] == "generation"} == {
        f"gen-{n}" for n in reservations
    }


@pytest.mark.django_db
def test_carried_records_a_redis_restarted_empty_lost_are_appended_again_with_their_settlements(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """What the settles appended is kept (compactly: gateway/ledger_kept.py) until the flush
    could have stored it: when Redis comes back empty, the next append sends it again, each
    reservation record with the settlement its settle gave it."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    settings.LEDGER_RETAIN_SECONDS = 3.2  # slices of 0.2 s: the first answers' are over
    buffer = LedgerBuffer()

    async def main() -> dict[str, Any]:
        client = sy_redis.async_client()
        settled: dict[str, Any] = {}
        try:
            store = RedisReservationStore(client, prefix=f"{redis_prefix}:q")
            await store.bootstrap()
            queue = BrokerQueue(RedisQueueStore(store))
            for n in range(4):
                grant = await _admit(queue, f"lost:{n}")
                carry = buffer.carry(_reservation(f"lost:{n}"), [_generation(f"gen-lost-{n}")])
                result = await queue.reconcile(grant, ACTUAL, pool=POOL, carry=carry)
                settlement = reservation_settled(result)
                settled[f"lost:{n}"] = settlement["settled"]
                await buffer.carried(carry, _reservation(f"lost:{n}") | settlement)
                await asyncio.sleep(0.25)
            await queue.close()
            wiped = sy_redis.sync_client()
            for name in wiped.scan_iter(match=f"{redis_prefix}:*"):  # Redis restarts empty
                wiped.delete(name)
            buffer.add({"kind": "generation", **_generation("gen-after")})
            await buffer.flush(time.monotonic())  # finds a new birth mark: appends them again
        finally:
            await client.aclose()
        return settled

    settled = asyncio.run(main())

    assert ledger_flush() == 9
    for n in range(4):
        row = Reservation.objects.get(id=f"lost:{n}")
        assert row.outcome == "reconciled"
        assert row.settled == settled[f"lost:{n}"]
    assert Generation.objects.filter(id__startswith="gen-").count() == 5
