"""The ledger, off the hot path: the proxy appends records to a Redis list; a Celery task claims
them in batches and stores them — ``generation`` records as ``Generation`` rows (one per request),
``reservation`` records as ``quotas.Reservation`` rows (C8) — idempotent by id.

Each gateway process gathers its records for a moment (LEDGER_BATCH_SECONDS) and appends them
with one RPUSH, so the ledger costs a Redis round trip per batch, not one or two per request.

Records go to Redis compressed (``record_encode``: Zstandard level 1 primed with the strings
every record shares, ``ledger_dictionary``; about 2.9 KB of JSON per proxied request becomes
about 600 bytes, for some 10–25 µs of CPU): the ledger was most of what a request sent Redis.
``record_decode`` reads every earlier form too, so records queued by an older process (plain
JSON, deflated with or without the dictionary) are still stored.

A record is in Redis before its answer is complete (I2: a worker killed a moment after
answering loses no row): the proxy awaits ``ledger_committed`` before it returns an answer, and
a stream's ending awaits it before the stream closes. That is a group commit: an append starts
at once when none is under way, and the answers that come while one is share the next, so at
high concurrency many answers take one round trip. LEDGER_COMMIT=false turns it off (records then
wait up to LEDGER_BATCH_SECONDS, and a killed worker loses those).

An answered request's own records need no append of their own: they ride in its settle's
round trip (``ledger_carry``, ``quotas.store.base.LedgerCarry``: the settle script appends them,
completing the reservation record with the settle's outcome and settlements as a trailer,
``CARRIED``), with the pins waiting for the next append; the answer's commit then has nothing of
its own to wait for. Where the settle cannot carry them (a settle outside a fair-queue pool, the
in-memory store) or fails, they are gathered for the next append as any record is.

Records appended are not yet stored: a Redis that restarts empty loses them. So each process
keeps what it appended for LEDGER_RETAIN_SECONDS (the flush runs every second; kept as bytes,
``gateway.ledger_kept``) and, in the same round trip as each append or carrying settle, reads
the ledger's birth mark: a mark it has not seen before means Redis lost its data, and the
process appends its kept records again (issue 13).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
import uuid
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import zstandard
from django.conf import settings
from django.db import models

from common import redis as sy_redis
from common.faultlog import faults
from gateway.ledger_dictionary import DICTIONARY_1
from gateway.ledger_kept import KeptRecords
from gateway.models import Generation, StoredResponse
from quotas import recovery
from quotas.models import Reservation
from quotas.store.base import LedgerCarry
from routing.live import live_router

log = logging.getLogger(__name__)

_CLAIM_LUA = (Path(__file__).parent / "lua" / "ledger_claim.lua").read_text()
# A claim older than this was abandoned by a crashed flush: its records go back to the queue.
# A flush runs every LEDGER_FLUSH_INTERVAL (1 s) and stores one batch in well under a second, so
# 30 s is far beyond a live flush; and were a slow one still running, storing its records twice
# is harmless (rows are created by id, ``ignore_conflicts``). Until then they are invisible.
STALE_CLAIM_SECONDS = 30.0


LEDGERS: dict[str, type[models.Model]] = {
    "generation": Generation,
    "reservation": Reservation,
    "response": StoredResponse,  # the Responses door's stored answers (gateway/response_store)
}
# A deleted stored response is marked for this long: a row of it still queued here (claims are
# returned after STALE_CLAIM_SECONDS) is dropped instead of stored after the delete.
RESPONSE_DELETED_SECONDS = int(4 * STALE_CLAIM_SECONDS)
DATETIME_FIELDS = ("created_at", "expires_at", "queue_deadline")


# A record's first byte says how it was packed (JSON itself starts with '{'):
DEFLATED = b"\x01"  # deflated alone (written by earlier versions, still read)
DEFLATED_PRIMED = b"\x02"  # deflated with ledger_dictionary.DICTIONARY_1 (earlier versions)
# A reservation record appended by its settle (queue_settle.lua): its length (4 bytes, big
# endian), the record as record_encode packed it, then the settle's JSON (outcome, settled).
CARRIED = b"\x03"
# Zstandard, level 1, with ledger_dictionary.DICTIONARY_1 as its (raw content) dictionary: what
# record_encode writes. Deflate primed the same way (DEFLATED_PRIMED, before) needed a new
# compressor and its tables for every record, ~12 µs for a proxied request's 1.4 KB record
# (~19 with the caches cold, 6 % of a loaded worker's CPU in a profile); a Zstandard compressor
# is made once per thread with the dictionary digested once: ~5 µs (~12 cold), the same size
# (bench/results/gateway_cpu.md, seventh session). Readers go first: a flush from before this
# format cannot read such a record and leaves its claim, which returns to the queue after
# STALE_CLAIM_SECONDS for a newer one (nothing is lost).
ZSTD_PRIMED = b"\x04"

_ZSTD_DICTIONARY = zstandard.ZstdCompressionDict(
    DICTIONARY_1, dict_type=zstandard.DICT_TYPE_RAWCONTENT
)
_ZSTD_DICTIONARY.precompute_compress(level=1)
_codecs = threading.local()  # a Zstandard (de)compressor is for one thread at a time


def _compressor() -> zstandard.ZstdCompressor:
    try:
        return _codecs.compressor  # type: ignore[no-any-return]
    except AttributeError:
        _codecs.compressor = zstandard.ZstdCompressor(
            dict_data=_ZSTD_DICTIONARY, write_checksum=False, write_dict_id=False
        )
        return _codecs.compressor  # type: ignore[no-any-return]


def _decompressor() -> zstandard.ZstdDecompressor:
    try:
        return _codecs.decompressor  # type: ignore[no-any-return]
    except AttributeError:
        _codecs.decompressor = zstandard.ZstdDecompressor(dict_data=_ZSTD_DICTIONARY)
        return _codecs.decompressor  # type: ignore[no-any-return]


def record_encode(record: dict[str, Any]) -> bytes:
    """One ledger record as it goes to Redis: its JSON, compressed with the records' preset
    dictionary when that is shorter."""
    raw = orjson.dumps(record)
    packed = _compressor().compress(raw)
    return ZSTD_PRIMED + packed if len(packed) + 1 < len(raw) else raw


def record_decode(item: bytes) -> Any:
    """A ledger record as queued in Redis (compressed, deflated either way, or plain JSON; a
    carried one with its settlement)."""
    if item[:1] == CARRIED:
        end = 5 + int.from_bytes(item[1:5], "big")
        record = record_decode(item[5:end])
        record.update(orjson.loads(item[end:]))
        return record
    if item[:1] == ZSTD_PRIMED:
        return orjson.loads(_decompressor().decompress(item[1:]))
    if item[:1] == DEFLATED_PRIMED:
        unpacker = zlib.decompressobj(-15, zdict=DICTIONARY_1)
        return orjson.loads(unpacker.decompress(item[1:]) + unpacker.flush())
    if item[:1] == DEFLATED:
        return orjson.loads(zlib.decompress(item[1:], wbits=-15))
    return orjson.loads(item)


class LedgerBuffer:
    """This process's records not yet in Redis, appended together by one background task, and
    those appended lately, kept in case Redis loses them before the flush stores them."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        # Small keys that ride with the next append (``ledger_write_later``): (key, value, ms).
        self.writes: list[tuple[str, bytes, int]] = []
        self.retained = KeptRecords()  # appended lately, in case Redis loses them
        self.born: bytes | None = None  # the ledger's birth mark when this process last looked
        self._flusher: asyncio.Task[None] | None = None
        self._watching = False  # the flusher sleeps only to look for a lost Redis
        self._added = 0  # records added by this process, and of them, appended to Redis
        self._appended = 0
        self._committing: asyncio.Future[None] | None = None

    def add(self, record: dict[str, Any]) -> None:
        self.records.append(record_encode(record))
        self._added += 1
        self._flush_due()

    def write(self, key: str, value: bytes, ttl_ms: int) -> None:
        self.writes.append((key, value, ttl_ms))
        self._flush_due()

    def _flush_due(self) -> None:
        """Append within the batch time (a commit may do it sooner)."""
        if self._flusher is not None and not self._flusher.done():
            if not self._watching:
                return  # a flush is due soon, or under way: it takes this record too
            self._flusher.cancel()  # asleep (never inside flush): append within the batch time
        self._watching = False
        self._flusher = asyncio.create_task(self._flush_soon(settings.LEDGER_BATCH_SECONDS))

    async def committed(self) -> None:
        """Return once every record added so far is in Redis, or an append failed (Redis away:
        they stay gathered, and the next flush takes them)."""
        target = self._added
        while self._appended < target:
            try:
                # Shielded: an answer whose client leaves does not cancel the others' append.
                await asyncio.shield(self._append_shared())
            except Exception:
                faults.warning(log, "ledger:redis", "ledger records could not reach Redis")
                return

    def _append_shared(self) -> asyncio.Future[None]:
        """The append under way, or a new one: commits and the batch timer share it, so a
        commit that comes while the timer's append holds its record waits for that one
        instead of sending an empty append of its own."""
        committing = self._committing
        if (
            committing is None
            or committing.done()
            or committing.get_loop() is not asyncio.get_running_loop()
        ):
            committing = self._committing = asyncio.ensure_future(self.flush(time.monotonic()))
        return committing

    async def _flush_soon(self, delay: float) -> None:
        await asyncio.sleep(delay)
        watching, self._watching = self._watching, False
        try:
            if self.records or self.writes or watching:  # a commit may have appended them
                await asyncio.shield(self._append_shared())
        except Exception:
            faults.warning(log, "ledger:redis", "ledger records could not reach Redis")
        if self.records or self.writes:
            self._flusher = asyncio.create_task(self._flush_soon(settings.LEDGER_BATCH_SECONDS))
        elif self.retained:
            # Kept records only: look for a lost Redis as often as the flush that stores them
            # runs (a round trip a second), not every batch time (20 a second, per process).
            self._watching = True
            self._flusher = asyncio.create_task(self._flush_soon(settings.LEDGER_FLUSH_INTERVAL))

    async def flush(self, now: float) -> None:
        """Append the gathered records; if Redis was born anew since the last look, the kept
        ones first. Gathered records stay gathered when Redis fails."""
        self._forget(now)
        batch, self.records = self.records, []
        # A write Redis did not take is not tried again: it is a hint (a conversation's pin),
        # and a later one may already have replaced it.
        writes, self.writes = self.writes, []
        try:
            await self._born_seen(await _append(batch, writes))
        except Exception:
            self.records[:0] = batch  # kept for the next flush
            raise
        if batch:
            self._keep(now, batch)
            self._appended += len(batch)

    def _keep(self, now: float, records: list[bytes]) -> None:
        """Keep ``records``, appended at ``now``, and let go of those kept long enough. Here and
        not only in the flush: under a steady load of carried answers no flush may run for
        minutes (each answer's pin arms the batch timer, and its settle takes the pin first)."""
        self.retained.keep(now, settings.LEDGER_RETAIN_SECONDS, records)

    def _forget(self, now: float) -> None:
        self.retained.forget(now, settings.LEDGER_RETAIN_SECONDS)

    def kept(self) -> list[bytes]:
        """The records appended lately, oldest first, as they were appended."""
        return self.retained.records()

    async def _born_seen(self, born: bytes) -> None:
        """If Redis was born anew since the last look, append the kept records again."""
        if self.born is not None and born != self.born:
            kept = self.kept()
            log.warning("Redis lost its data: %d ledger records appended again", len(kept))
            if kept:
                await _append(kept)
        self.born = born

    def carry(self, reservation: dict[str, Any], own: list[dict[str, Any]]) -> LedgerCarry:
        """An append for a settle's round trip: ``reservation`` (a record the settle completes
        with its outcome and settlements), the answer's ``own`` records, and the writes waiting
        for the next append."""
        writes, self.writes = self.writes, []
        return LedgerCarry(
            key=sy_redis.key("ledger"),
            born_key=sy_redis.key("ledger", "born"),
            mark=secrets.token_hex(16).encode(),  # per answer: cheaper than a uuid4
            settled=record_encode({"kind": "reservation", **reservation}),
            records=[record_encode(record) for record in own],
            writes=writes,
        )

    def uncarried(self, carry: LedgerCarry) -> None:
        """The settle did not carry them: the answer's records and the writes wait for the
        next append (the reservation record is the caller's)."""
        self.writes[:0] = carry.writes
        self.records += carry.records
        self._added += len(carry.records)
        if carry.records or carry.writes:
            self._flush_due()

    async def carried(self, carry: LedgerCarry, reservation: dict[str, Any]) -> None:
        """After the settle: what it appended is kept as an append's records are, and the
        birth mark it read is looked at; if it did not carry them, ``reservation`` (the whole
        record) and the answer's records are gathered for the next append."""
        if carry.born is None:
            self.uncarried(carry)
            self.add({"kind": "reservation", **reservation})
            return
        try:
            await self._born_seen(carry.born)
        except Exception:
            faults.warning(log, "ledger:redis", "ledger records could not reach Redis")
        # Kept as the settle appended it, but for its trailer's number spelling (repr here,
        # %.17g there: the same floats).
        settlement = orjson.dumps({k: reservation[k] for k in ("outcome", "settled")})
        size = len(carry.settled).to_bytes(4, "big")
        self.retained.keep_tailed(
            time.monotonic(),
            settings.LEDGER_RETAIN_SECONDS,
            CARRIED + size + carry.settled,
            settlement,  # its settlement: kept deflated with the others of the same second
            carry.records,
        )
        if self._flusher is None or self._flusher.done():
            # Look for a lost Redis while the kept records are not yet stored (_flush_soon).
            self._watching = True
            self._flusher = asyncio.create_task(self._flush_soon(settings.LEDGER_FLUSH_INTERVAL))

    async def drain(self) -> None:
        """Append what is left (the process is shutting down)."""
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
        committing = self._committing
        if committing is not None and not committing.done():
            await committing  # the append under way (shielded from the cancel) lands first
        await self.flush(time.monotonic())


# The configuration's version as this process's last append read it, and when that round trip
# was sent (monotonic). The snapshot's poll takes it in place of a GET of its own
# (gateway/snapshot.py): with answers coming one by one, each its own append, those GETs were
# about a third of the round trips that were not an answer's append (bench/results/redis.md).
_config_version: tuple[int, float] | None = None


def config_version_read() -> tuple[int, float] | None:
    return _config_version


async def _append(batch: list[bytes], writes: Sequence[tuple[str, bytes, int]] = ()) -> bytes:
    """Append ``batch`` (if any), set the ``writes``, and return the ledger's birth mark, set
    if Redis has none: one round trip."""
    born = sy_redis.key("ledger", "born")
    pipe = sy_redis.async_client().pipeline(transaction=False)
    if batch:
        pipe.rpush(sy_redis.key("ledger"), *batch)
    for key, value, ttl_ms in writes:
        pipe.set(key, value, px=ttl_ms)
    # SET NX GET (Redis 7): the mark there, or nil when this call just set it; one command
    # where SET NX then GET were two (some 25 µs of CPU per append in redis-py).
    mark = uuid.uuid4().hex.encode()
    pipe.set(born, mark, nx=True, get=True)
    pipe.get(sy_redis.key("config", "version"))
    own = len(pipe)
    # The routing statistics' sync and the heartbeat's look, when due, ride along
    # (routing/live.py, quotas/recovery.py): one round trip where there were up to three.
    # Errors come back as replies, so that one of theirs stays theirs.
    rides = []
    for ride in (live_router().sync_ride, recovery.look_ride):
        start = len(pipe)
        arrive = ride(pipe)
        if arrive is not None:
            rides.append((arrive, start, len(pipe)))
    sent = time.monotonic()
    replies = await pipe.execute(raise_on_error=False)
    loop = asyncio.get_running_loop()
    for arrive, start, end in rides:
        loop.call_soon(arrive, replies[start:end])  # after this answer
    for reply in replies[:own]:
        if isinstance(reply, Exception):
            raise reply
    global _config_version
    _config_version = (int(replies[own - 1] or 0), sent)
    found = replies[own - 2]
    return mark if found is None else bytes(found)


_buffer = LedgerBuffer()


async def ledger_drain() -> None:
    await _buffer.drain()


async def ledger_committed() -> None:
    """Wait until the records gathered so far are in Redis (see the module doc)."""
    if settings.LEDGER_COMMIT:
        await _buffer.committed()


def ledger_carry(reservation: dict[str, Any], own: list[dict[str, Any]]) -> LedgerCarry:
    """An answer's records for its settle's round trip (``LedgerBuffer.carry``)."""
    return _buffer.carry(reservation, own)


def ledger_uncarried(carry: LedgerCarry) -> None:
    """The settle failed: the answer's records wait for the next append."""
    _buffer.uncarried(carry)


async def ledger_carried(carry: LedgerCarry, reservation: dict[str, Any]) -> None:
    """The settle returned: kept what it appended, or gather what it did not carry."""
    await _buffer.carried(carry, reservation)


def ledger_write_later(key: str, value: bytes, ttl_ms: int) -> None:
    """Set ``key`` (expiring after ``ttl_ms``) in the round trip of the next append, which an
    answer awaits anyway: a conversation's pin (G12) written after every answer took a round
    trip of its own, a quarter of a request's Redis calls. Not retried if Redis fails."""
    _buffer.write(key, value, ttl_ms)


def ledger_record_later(kind: str, record: dict[str, Any]) -> None:
    """Queue one ledger record: it reaches Redis with the next append, which an answer waits
    for in ``ledger_committed`` (not here)."""
    _buffer.add({"kind": kind, **record})


def ledger_flush(*, batch_size: int = 1000, now: float | None = None) -> int:
    """Move queued records into the database; returns how many were stored."""
    client = sy_redis.sync_client()
    now = time.time() if now is None else now
    claims = sy_redis.key("ledger", "claims")
    for stale in client.zrangebyscore(claims, "-inf", now - STALE_CLAIM_SECONDS):
        _claim_return(client, stale, claims)
    claim = sy_redis.key("ledger", "claim", uuid.uuid4().hex)
    script = client.register_script(_CLAIM_LUA)
    items = script(keys=[sy_redis.key("ledger"), claim, claims], args=[batch_size, now])
    if not items:
        return 0
    rows: dict[str, list[models.Model]] = {kind: [] for kind in LEDGERS}
    for item in items:
        record = record_decode(item)
        kind = record.pop("kind", "generation")
        rows[kind].append(_row(LEDGERS[kind], record))
    rows["response"] = _not_deleted(client, rows["response"])
    for kind, batch in rows.items():
        LEDGERS[kind].objects.bulk_create(batch, ignore_conflicts=True, batch_size=500)
    client.delete(claim)
    client.zrem(claims, claim)
    return len(items)


def response_deleted_key(response_id: str) -> str:
    return sy_redis.key("response", "deleted", response_id)


def _not_deleted(client: Any, responses: list[models.Model]) -> list[models.Model]:
    """Stored responses their app deleted while their rows waited here are not stored."""
    if not responses:
        return responses
    pipe = client.pipeline(transaction=False)
    for row in responses:
        pipe.exists(response_deleted_key(row.pk))
    return [row for row, gone in zip(responses, pipe.execute(), strict=True) if not gone]


def ledger_backlog(client: Any | None = None) -> int:
    """Records waiting in Redis: queued, plus claimed by a flush and not yet stored."""
    client = sy_redis.sync_client() if client is None else client
    claims = client.zrange(sy_redis.key("ledger", "claims"), 0, -1)
    pipe = client.pipeline(transaction=False)
    pipe.llen(sy_redis.key("ledger"))
    for claim in claims:
        pipe.llen(claim)
    return sum(int(n) for n in pipe.execute())


def _claim_return(client: Any, claim: bytes, claims: str) -> None:
    items = client.lrange(claim, 0, -1)
    pipe = client.pipeline()
    if items:
        pipe.rpush(sy_redis.key("ledger"), *items)
    pipe.delete(claim)
    pipe.zrem(claims, claim)
    pipe.execute()


def _row(model: type[models.Model], record: dict[str, Any]) -> models.Model:
    fields = {f.name for f in model._meta.get_fields()}
    values = {name: without_nul(value) for name, value in record.items() if name in fields}
    for name in DATETIME_FIELDS:
        if values.get(name) is not None:
            values[name] = datetime.fromtimestamp(values[name], tz=UTC)
    return model(**values)


def without_nul(value: Any) -> Any:
    """``value`` with each NUL character made U+FFFD: PostgreSQL stores no NUL in text or
    jsonb, and one refused ledger row would fail its whole batch at every flush (a provider
    may send one: in a finish reason, in an answer a job keeps)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(item) for item in value]
    return value
