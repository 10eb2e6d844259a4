"""The ledger's flush (C8): records a crashed flush had claimed come back soon, stored once."""

from __future__ import annotations

import asyncio
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest

from common import redis as sy_redis
from gateway import ledger
from gateway.ledger import (
    DEFLATED,
    DEFLATED_PRIMED,
    ZSTD_PRIMED,
    LedgerBuffer,
    ledger_backlog,
    ledger_flush,
    record_decode,
    record_encode,
)
from gateway.ledger_dictionary import DICTIONARY_1
from gateway.models import Generation
from quotas.models import Reservation


def _crashed_claim(ident: str, claimed_at: float) -> None:
    """What a flush leaves behind when it dies between claiming its records and storing them."""
    client = sy_redis.sync_client()
    record = {
        "kind": "reservation",
        "id": ident,
        "request_id": ident.split(":")[0],
        "created_at": claimed_at - 1,
        "outcome": "reconciled",
        "taken": {"app:acme/search/web:requests:1m": 1.0},
    }
    claim = sy_redis.key("ledger", "claim", ident)
    client.rpush(claim, orjson.dumps(record))
    client.zadd(sy_redis.key("ledger", "claims"), {claim: claimed_at})


@pytest.mark.django_db
def test_it_stores_the_records_of_a_crashed_flush_half_a_minute_later(redis_prefix: str) -> None:
    now = time.time()
    _crashed_claim("gen-crashed:1", claimed_at=now - 31)
    _crashed_claim("gen-recent:1", claimed_at=now - 5)  # maybe a flush still at work: left alone
    assert ledger_backlog() == 2

    assert ledger_flush(now=now) == 1

    assert list(Reservation.objects.values_list("id", flat=True)) == ["gen-crashed:1"]
    assert ledger_backlog() == 1
    # Stored twice (the crashed flush had in fact written them): still one row.
    _crashed_claim("gen-crashed:1", claimed_at=now - 40)
    assert ledger_flush(now=now) == 1
    assert Reservation.objects.filter(id="gen-crashed:1").count() == 1


@pytest.mark.django_db
def test_it_stores_a_record_with_a_nul_character_instead_of_failing_its_batch(
    redis_prefix: str,
) -> None:
    """PostgreSQL refuses NUL in text and jsonb; a provider's finish reason may carry one."""
    now = time.time()
    record = {
        "kind": "generation",
        "id": "gen-nul",
        "created_at": now,
        "tenant_id": 1,
        "app_id": 1,
        "api_key_id": 1,
        "model": "acme/chat-small",
        "status": 200,
        "finish_reason": "st\u0000op",
        "detail": {"native_finish_reason": "st\u0000op", "explanation": ["a\u0000"]},
    }
    sy_redis.sync_client().rpush(sy_redis.key("ledger"), orjson.dumps(record))

    assert ledger_flush(now=now) == 1

    stored = Generation.objects.get(pk="gen-nul")
    assert stored.finish_reason == "st\ufffdop"
    assert stored.detail["native_finish_reason"] == "st\ufffdop"
    assert ledger_backlog() == 0


def _generation(ident: str) -> dict[str, object]:
    return {"id": ident, "created_at": time.time(), "tenant_id": 1, "app_id": 1, "status": 200}


def _forget_everything(prefix: str) -> None:
    """What a Redis restarted empty holds of this deployment: nothing."""
    client = sy_redis.sync_client()
    for name in client.scan_iter(match=f"{prefix}:*"):
        client.delete(name)


@pytest.mark.django_db
def test_it_appends_again_what_a_redis_restarted_empty_lost_before_the_flush_stored_it(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sy_redis, "_async_client", None)
    buffer = LedgerBuffer()

    async def main() -> None:
        try:
            buffer.records.append(orjson.dumps({"kind": "generation", **_generation("gen-a")}))
            await buffer.flush(now=100.0)  # appended, not stored yet…
            _forget_everything(redis_prefix)  # …when Redis restarts empty
            buffer.records.append(orjson.dumps({"kind": "generation", **_generation("gen-b")}))
            await buffer.flush(now=101.0)
        finally:
            await sy_redis.async_client().aclose()

    asyncio.run(main())

    assert ledger_flush() == 2
    assert sorted(Generation.objects.values_list("id", flat=True)) == ["gen-a", "gen-b"]


@pytest.mark.django_db
def test_it_keeps_what_it_appended_only_for_a_while_and_appends_it_again_only_after_a_loss(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    monkeypatch.setattr(sy_redis, "_async_client", None)
    settings.LEDGER_RETAIN_SECONDS = 15.0  # type: ignore[attr-defined]
    buffer = LedgerBuffer()

    async def main() -> None:
        try:
            buffer.records.append(orjson.dumps({"kind": "generation", **_generation("gen-old")}))
            await buffer.flush(now=100.0)
            buffer.records.append(orjson.dumps({"kind": "generation", **_generation("gen-new")}))
            await buffer.flush(now=110.0)  # Redis as it was: nothing appended twice
            assert await sy_redis.async_client().llen(sy_redis.key("ledger")) == 2
            _forget_everything(redis_prefix)
            await buffer.flush(now=120.0)  # gen-old is 20 s old: no longer kept
        finally:
            await sy_redis.async_client().aclose()

    asyncio.run(main())

    assert ledger_flush() == 1
    assert list(Generation.objects.values_list("id", flat=True)) == ["gen-new"]


@pytest.mark.django_db
def test_records_go_to_redis_compressed_and_earlier_forms_are_still_stored(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most of what a request sends Redis is its ledger records: they travel compressed, primed
    with the strings every record shares. Records queued as plain JSON or deflated with or
    without the dictionary (by a process from before) are stored all the same."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    buffer = LedgerBuffer()
    record = {"kind": "generation", **_generation("gen-compressed")}
    record["detail"] = {"route": "strategy=routing_cost; winner=alpha " * 8, "attempts": []}

    async def main() -> None:
        try:
            buffer.records.append(record_encode(record))
            await buffer.flush(now=100.0)
        finally:
            await sy_redis.async_client().aclose()

    asyncio.run(main())
    [item] = sy_redis.sync_client().lrange(sy_redis.key("ledger"), 0, -1)
    assert item[:1] == ZSTD_PRIMED and len(item) < len(orjson.dumps(record)) / 4
    assert record_decode(item) == orjson.loads(orjson.dumps(record))
    plain = {"kind": "generation", **_generation("gen-plain")}
    earlier = {"kind": "generation", **_generation("gen-deflated-alone")}
    alone = DEFLATED + zlib.compress(orjson.dumps(earlier), 1, wbits=-15)
    primed = {"kind": "generation", **_generation("gen-deflated-primed")}
    packer = zlib.compressobj(1, zlib.DEFLATED, -13, 6, zdict=DICTIONARY_1)
    deflated = DEFLATED_PRIMED + packer.compress(orjson.dumps(primed)) + packer.flush()
    sy_redis.sync_client().rpush(sy_redis.key("ledger"), orjson.dumps(plain), alone, deflated)

    assert ledger_flush() == 4
    stored = sorted(Generation.objects.values_list("id", flat=True))
    assert stored == ["gen-compressed", "gen-deflated-alone", "gen-deflated-primed", "gen-plain"]


def test_a_long_record_reads_back_and_so_do_both_forms_deflate_wrote_before() -> None:
    """Earlier processes deflated records primed with the same dictionary, in an 8 KB window
    and, before that, zlib's full one (a raw deflate stream does not name its window): both
    still read, and so does a record far longer than either window."""
    long = {"kind": "generation", **_generation("gen-long")}
    long["detail"] = {"attempts": [{"endpoint": f"p{i}", "error": "x" * i} for i in range(400)]}
    raw = orjson.dumps(long)
    assert len(raw) > 2 * (1 << 15)  # longer than either window
    assert record_decode(record_encode(long)) == orjson.loads(raw)
    for wbits, memlevel in ((13, 6), (15, 8)):
        earlier = zlib.compressobj(1, zlib.DEFLATED, -wbits, memlevel, zdict=DICTIONARY_1)
        before = DEFLATED_PRIMED + earlier.compress(raw) + earlier.flush()
        assert record_decode(before) == orjson.loads(raw)


def test_records_encoded_on_several_threads_at_once_each_read_back() -> None:
    """A Zstandard compressor serves one thread at a time: each thread has its own."""
    records = [{"kind": "generation", **_generation(f"gen-thread-{i}")} for i in range(400)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        encoded = list(pool.map(record_encode, records))
    assert [record_decode(item) for item in encoded] == [
        orjson.loads(orjson.dumps(r)) for r in records
    ]


def test_an_answer_waits_for_its_record_to_reach_redis_not_for_the_batch_time(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    """I2: a worker killed right after answering has already appended the answer's record."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    settings.LEDGER_BATCH_SECONDS = 30.0  # type: ignore[attr-defined]
    buffer = LedgerBuffer()

    async def main() -> tuple[int, float]:
        try:
            buffer.add({"kind": "generation", **_generation("gen-a")})
            started = time.monotonic()
            await buffer.committed()
            waited = time.monotonic() - started
            return await sy_redis.async_client().llen(sy_redis.key("ledger")), waited
        finally:
            await sy_redis.async_client().aclose()

    queued, waited = asyncio.run(main())

    assert queued == 1
    assert waited < 5.0  # not the 30 s batch time


def test_answers_committing_together_share_appends(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: 50 answers at once take one append for the first and one for the rest."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    # Counted here, not in INFO commandstats: the other test workers share this Redis.
    appends: list[int] = []
    real_append = ledger._append

    async def counted(batch: list[bytes], writes: Any = ()) -> bytes:
        appends.append(len(batch))
        return await real_append(batch, writes)

    monkeypatch.setattr(ledger, "_append", counted)
    buffer = LedgerBuffer()

    async def answer(ident: str) -> None:
        buffer.add({"kind": "generation", **_generation(ident)})
        await buffer.committed()

    async def main() -> int:
        try:
            await asyncio.gather(*(answer(f"gen-{n}") for n in range(50)))
            return await sy_redis.async_client().llen(sy_redis.key("ledger"))
        finally:
            await sy_redis.async_client().aclose()

    queued = asyncio.run(main())

    assert queued == 50
    assert sum(appends) == 50 and len([n for n in appends if n]) <= 2, appends


def test_an_answer_whose_record_the_batch_timer_took_waits_for_that_append(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    """The timer's append and the commits share one append: no empty append of their own."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    settings.LEDGER_BATCH_SECONDS = 0.0  # type: ignore[attr-defined]
    appends: list[int] = []
    real_append = ledger._append

    async def slow(batch: list[bytes], writes: Any = ()) -> bytes:
        appends.append(len(batch))
        await asyncio.sleep(0.2)  # the answer's commit comes while this append holds its record
        return await real_append(batch, writes)

    monkeypatch.setattr(ledger, "_append", slow)
    buffer = LedgerBuffer()

    async def main() -> int:
        try:
            buffer.add({"kind": "generation", **_generation("gen-a")})
            await asyncio.sleep(0.05)  # the timer's append has taken the record
            assert appends == [1] and not buffer.records
            await buffer.committed()
            return await sy_redis.async_client().llen(sy_redis.key("ledger"))
        finally:
            await sy_redis.async_client().aclose()

    queued = asyncio.run(main())

    assert queued == 1
    assert appends == [1]


def test_an_answer_is_not_held_when_redis_is_away(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    """The append fails; the record stays gathered for the next flush and the answer goes out."""
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # type: ignore[attr-defined]  # nothing listens
    monkeypatch.setattr(sy_redis, "_async_client", None)
    buffer = LedgerBuffer()

    async def main() -> None:
        try:
            buffer.add({"kind": "generation", **_generation("gen-a")})
            await asyncio.wait_for(buffer.committed(), timeout=5.0)
        finally:
            await sy_redis.async_client().aclose()

    asyncio.run(main())

    assert len(buffer.records) == 1
