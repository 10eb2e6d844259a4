"""The Redis reservation store: one Lua call to reserve in all of a request's buckets, one to
reconcile or release (SPEC C4, C6). Redis holds levels, usage, holders, pauses and lease
records; bucket definitions come from the caller, so config changes need no migration.

A request's buckets (their definitions, keys and, for the fair queue, sides and lane) go to
Redis once as a *spec set*: a string named by a digest of its content (``specs``), which the
hot scripts read by key, so a call ships the key and its amounts, not some 2 KB of
definitions. This process remembers which sets it registered; the first call with a new set
(a new config version, a fixed window's new boundaries) carries the definition and stores it
in the same round trip. If Redis lost it (restarted, flushed, the set's week-long TTL ran out)
the script answers ``{'S'}`` having changed nothing, and the call is made again with the
definition (``_call_specs``).

Scripts are the entry files of one Redis function library (``library.py``: ``lua/lib.lua``,
``lua/queue_lib.lua`` and each entry file as a registered function), loaded once and run with
FCALL; a Redis that lost it (restarted, ``FUNCTION FLUSH``) gets it again and the call is
retried, so a lost library never surfaces as an error.

A connection error (Redis restarted, a stale pooled connection) is retried twice: every script
is safe to repeat — reserve is idempotent by reservation id; a repeated reconcile, release or
renew answers ``closed`` (already done). redis-py clients made with ``from_url`` do not retry
by themselves (their connections get ``Retry(NoBackoff(), 0)``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from quotas.core.book import demand_parts, extension_amount
from quotas.core.fairqueue import bucket_sides, lane_of
from quotas.core.keys import (
    bucket_key,
    epoch_key,
    holders_key,
    lease_index_key,
    pause_key,
    record_key,
)
from quotas.core.model import (
    BucketLevel,
    BucketSpec,
    Dimension,
    ExpiredLease,
    Extension,
    Grant,
    Outcome,
    ReconcileResult,
    Refusal,
    RenewResult,
    Settlement,
    Usage,
)
from quotas.core.recovery import Epoch
from quotas.core.windows import Boundaries, BoundaryCache
from quotas.store.library import STORE_ENTRIES, FunctionLibrary
from quotas.store.wire import f_, msgpack_array, msgpack_list, parse_extend, parse_reserve, s_

LUA = Path(__file__).with_name("lua")
CONNECTION_RETRIES = (0.0, 0.05)  # pauses before the retries after a connection error
SCRIPTS = STORE_ENTRIES
SPEC_SETS_KEPT = 4096  # spec sets remembered per process (as registered in Redis)
# Where a script's ARGV holds the spec set (0-based).
SPEC_ARG = {"reserve": 3, "settle": 9, "extend": 2}


def queue_prefix(prefix: str, pool: str) -> str:
    """A pool's fair-queue keys share the pool scope's hash tag (quotas/store/queue_redis.py)."""
    return f"{prefix}:{{{pool}}}:q"


def _unknown_specs(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) == 1 and reply[0] in (b"S", "S")


def lua_source(name: str) -> str:
    """An entry script with lib.lua in front of it, as an EVAL script (the benchmarks'
    baselines; the store runs the function library)."""
    if name in ("bootstrap", "noop", "recovery_end"):
        return (LUA / f"{name}.lua").read_text()
    return (LUA / "lib.lua").read_text() + "\n" + (LUA / f"{name}.lua").read_text()


@dataclass(frozen=True, slots=True)
class EpochState:
    """What ``recovery_look`` read: Redis's clock, the epoch, the members that reported in it,
    and how many provider pauses were set in it (``pause``)."""

    now: float
    epoch: Epoch
    reported: frozenset[str]
    pauses: int = 0


class RedisReservationStore:
    """``ReservationStore`` on one Redis primary (see quotas/store/README.md for Cluster)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str = "sy",
        lease_seconds: float = 30.0,
        max_lease_seconds: float | None = None,
        retention_seconds: float = 300.0,
        expire_limit: int = 16,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.lease_seconds = lease_seconds
        self.max_lease_seconds = max_lease_seconds or lease_seconds
        self.retention_seconds = retention_seconds
        self.expire_limit = expire_limit
        self._retention = repr(float(retention_seconds))
        self._max_lease = repr(float(self.max_lease_seconds))
        self._limit = str(expire_limit)
        self.library = FunctionLibrary(client)
        self._bounds = BoundaryCache()
        self._specs: dict[BucketSpec, tuple[Boundaries, tuple[bytes, str, str, str]]] = {}
        # (specs, pool) → (their blobs, spec key, definition); the spec keys Redis has
        self._sets: dict[tuple[Any, ...], tuple[tuple[bytes, ...], str, bytes]] = {}
        self._registered: set[str] = set()
        self._epoch = epoch_key(prefix)
        self._index = lease_index_key(prefix)
        # Redis TIME minus the local clock, learned from replies: fixed-window boundaries are
        # computed here for the server's "now" (the script then picks among four of them).
        self._offset = 0.0

    async def _call(self, name: str, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        for pause in CONNECTION_RETRIES:
            try:
                return await self._run(name, keys, args)
            except RedisConnectionError:
                await asyncio.sleep(pause)
        return await self._run(name, keys, args)

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        return await self.library.call(name, keys, args)

    def _local_now(self, now: float | None) -> float:
        return time.time() + self._offset if now is None else now

    def _learn_clock(self, server_now: float, now: float | None) -> None:
        if now is None:
            self._offset = server_now - time.time()

    def _bucket(self, spec: BucketSpec, at: float) -> tuple[bytes, str, str, str]:
        """The bucket's blob (its definition for Lua) and its three keys, cached per spec."""
        x = self._bounds.numbers(spec, at)
        cached = self._specs.get(spec)
        if cached is not None and cached[0] == x:
            return cached[1]
        blob = msgpack_array(
            [
                spec.name,
                spec.rule.value,
                spec.dimension.value,
                spec.capacity,
                spec.period,
                *x,
                1 if spec.shadow else 0,
                1 if spec.cached_input_free else 0,
            ]
        )
        entry = (
            blob,
            bucket_key(self.prefix, spec),
            holders_key(self.prefix, spec),
            pause_key(self.prefix, spec.scope),
        )
        if len(self._specs) > 4096:
            self._specs.clear()
        self._specs[spec] = (x, entry)
        return entry

    def _record_key(self, grant: Grant) -> str:
        return record_key(self.prefix, grant.parts[0].bucket.scope, grant.reservation_id)

    def specs(
        self, buckets: Sequence[BucketSpec], at: float, pool: str | None = None
    ) -> tuple[str, bytes]:
        """The spec key and definition of ``buckets`` (lib.lua specs_load), cached: the
        request's lane in its flow and the pool's queue prefix ('' when not queued), the lease
        record's key prefix, this store's retention, max lease and expiry limit, then per part
        its blob, bucket, holders and pause keys and its side in ``pool``'s fair queue (0 when
        not queued)."""
        cache_key = (tuple(buckets), pool)
        entries = [self._bucket(spec, at) for spec in buckets]
        blobs = tuple(e[0] for e in entries)
        cached = self._sets.get(cache_key)
        if cached is not None and cached[0] == blobs:
            return cached[1], cached[2]
        sides = [0] * len(buckets)
        lane = ""
        if pool is not None:
            queue_sides = bucket_sides(buckets, pool)
            sides = [int(side) for side in queue_sides]
            lane = lane_of(buckets, queue_sides)
        record_prefix = record_key(self.prefix, buckets[0].scope, "")
        values: list[str | bytes | float | int] = [
            len(buckets),
            lane,
            record_prefix,
            "" if pool is None else queue_prefix(self.prefix, pool),
            float(self.retention_seconds),
            float(self.max_lease_seconds),
            int(self.expire_limit),
        ]
        for (blob, bkey, hkey, pkey), side in zip(entries, sides, strict=True):
            values += (blob, bkey, hkey, pkey, side)
        definition = msgpack_list(values)
        digest = hashlib.blake2b(definition, digest_size=10).hexdigest()
        skey = f"{self.prefix}:spec:{digest}"
        if len(self._sets) > SPEC_SETS_KEPT:
            self._sets.clear()
        self._sets[cache_key] = (blobs, skey, definition)
        return skey, definition

    async def call_specs(
        self,
        name: str,
        keys: Sequence[str],
        args: list[str | bytes],
        at: int,
        skey: str,
        definition: bytes,
    ) -> Any:
        """Run a script whose ``args[at]`` is a spec set's definition: '' when Redis has it
        (as far as this process knows), the definition when not, and again with it when
        the script answers {'S'} (Redis lost it; nothing was done)."""
        args[at] = b"" if skey in self._registered else definition
        reply = await self._call(name, keys, args)
        if _unknown_specs(reply) and args[at] == b"":
            args[at] = definition
            reply = await self._call(name, keys, args)
        if not _unknown_specs(reply):
            if len(self._registered) > SPEC_SETS_KEPT:
                self._registered.clear()
            self._registered.add(skey)
        return reply

    @staticmethod
    def _clock_arg(now: float | None) -> str:
        return "" if now is None else repr(now)

    async def scripts_load(self) -> int:
        """Load the function library into Redis if it lacks it (a new or restarted Redis has
        none); returns 1 if it was missing, else 0. One FUNCTION LIST, plus a FUNCTION LOAD."""
        return int(await self.library.ensure())

    # -- hooks for the fair queue (quotas/store/queue_redis.py): its scripts are in the same
    # library and share lib.lua, the bucket blobs, the clock and settle.lua's arguments.
    async def run_script(self, name: str, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        return await self._call(name, keys, args)

    def bucket_call(self, spec: BucketSpec, at: float) -> tuple[bytes, str, str, str]:
        """A bucket's blob and its bucket, holders and pause keys."""
        return self._bucket(spec, at)

    def lease_args(self, now: float | None) -> tuple[list[str], list[str]]:
        """[epoch, lease index] and [clock, retention, max lease, expiry limit]."""
        return [self._epoch, self._index], [
            self._clock_arg(now),
            self._retention,
            self._max_lease,
            self._limit,
        ]

    def local_now(self, now: float | None = None) -> float:
        """``now``, or this process's estimate of Redis's clock."""
        return self._local_now(now)

    def learn_clock(self, server_now: float, now: float | None) -> None:
        self._learn_clock(server_now, now)

    async def bootstrap(self) -> bool:
        return bool(await self._call("bootstrap", [self._epoch], []))

    async def recovery_look(
        self,
        member: str | None = None,
        *,
        epoch: Epoch | None = None,
        now: float | None = None,
    ) -> EpochState:
        """The epoch (created learning if missing) and, while it learns, who reported in it;
        with ``member``, that member's report is recorded first — only in ``epoch`` if given,
        the one it re-registered its reservations in (quotas/core/recovery.py)."""
        born = "" if epoch is None else repr(epoch.born)
        args = [self._clock_arg(now), self._max_lease, member or "", born]
        return self.recovery_state(await self._call("recovery", [self._epoch], args), now)

    def recovery_look_command(self) -> tuple[str | int, ...]:
        """A plain look (``recovery_look()``) as a command to send in another's round trip (a
        pipeline); ``recovery_state`` reads its reply. A Redis that lost the library answers
        it with an error: only ``recovery_look`` loads it again."""
        name = self.library.function("recovery")
        return ("FCALL", name, 1, self._epoch, "", self._max_lease, "", "")

    def recovery_state(self, reply: Any, now: float | None = None) -> EpochState:
        self._learn_clock(f_(reply[0]), now)
        reported = frozenset(s_(r) for r in reply[5 : 5 + int(reply[4])])
        return EpochState(
            f_(reply[0]), Epoch(f_(reply[1]), f_(reply[2])), reported, pauses=int(reply[3])
        )

    async def recovery_end(self, epoch: Epoch, *, until: float, born: float) -> bool:
        """Bring the learning period of ``epoch`` forward to ``until`` and its birth back to
        ``born`` (never later); False if Redis holds another epoch by now."""
        args = [repr(epoch.born), repr(float(until)), repr(float(born))]
        return bool(await self._call("recovery_end", [self._epoch], args))

    def reserve_call(
        self, reservation_id: str, buckets: Sequence[BucketSpec], demand: Usage
    ) -> tuple[list[str], list[str | bytes]]:
        """The KEYS and ARGV of one reserve call (the benchmark's no-op gets the same), with
        the spec set's definition in (as a first call sends it)."""
        keys, args, _, definition = self._reserve_call(
            reservation_id, demand_parts(buckets, demand), None, float(self.lease_seconds)
        )
        args[SPEC_ARG["reserve"]] = definition
        return keys, args

    def _reserve_call(
        self,
        reservation_id: str,
        parts: Sequence[tuple[BucketSpec, float]],
        now: float | None,
        lease: float,
    ) -> tuple[list[str], list[str | bytes], str, bytes]:
        skey, definition = self.specs([spec for spec, _ in parts], self._local_now(now))
        keys: list[str] = [self._epoch, self._index, skey]
        args: list[str | bytes] = [
            self._clock_arg(now),
            reservation_id,
            repr(lease),
            b"",
            *(repr(amount) for _, amount in parts),
        ]
        return keys, args, skey, definition

    async def reserve(
        self,
        reservation_id: str,
        buckets: Sequence[BucketSpec],
        demand: Usage,
        *,
        now: float | None = None,
        lease_seconds: float | None = None,
    ) -> Grant | Refusal:
        lease = float(self.lease_seconds if lease_seconds is None else lease_seconds)
        parts = demand_parts(buckets, demand)
        keys, args, skey, definition = self._reserve_call(reservation_id, parts, now, lease)
        reply = await self.call_specs("reserve", keys, args, SPEC_ARG["reserve"], skey, definition)
        self._learn_clock(f_(reply[1]), now)
        return parse_reserve(reservation_id, reply, parts, lease)

    def settle_call(
        self, grant: Grant, actual: Usage | None, now: float | None, pool: str | None = None
    ) -> tuple[list[str], list[str | bytes], str, bytes]:
        """The KEYS and ARGV of settle.lua (the fair queue appends its own after them), its
        spec key and definition (``args[SPEC_ARG["settle"]]`` is left to ``call_specs``);
        ``pool``: the parts' sides as the queue admitted them, so one spec set serves both."""
        usage = actual or Usage(requests=0.0)
        specs = [p.bucket for p in grant.parts]
        skey, definition = self.specs(specs, self._local_now(now), pool)
        keys = [self._epoch, self._index, skey]
        args: list[str | bytes] = [
            self._clock_arg(now),
            grant.reservation_id,
            "1" if actual is None else "0",
            repr(float(usage.requests)),
            repr(float(usage.input_tokens)),
            repr(float(usage.output_tokens)),
            repr(usage.amount(Dimension.TOTAL_TOKENS)),
            repr(float(usage.spend)),
            repr(float(usage.cached_input_tokens)),
            b"",
        ]
        return keys, args, skey, definition

    def settle_result(self, grant: Grant, reply: Any, now: float | None) -> ReconcileResult:
        self._learn_clock(f_(reply[1]), now)
        settlements = []
        for i in range(int(reply[2])):
            row = reply[3 + 5 * i : 8 + 5 * i]
            settlements.append(Settlement(s_(row[0]), *(f_(v) for v in row[1:])))
        return ReconcileResult(
            grant.reservation_id, Outcome(s_(reply[0])), f_(reply[1]), tuple(settlements)
        )

    async def _settle(
        self, grant: Grant, actual: Usage | None, now: float | None
    ) -> ReconcileResult:
        keys, args, skey, definition = self.settle_call(grant, actual, now)
        reply = await self.call_specs("settle", keys, args, SPEC_ARG["settle"], skey, definition)
        return self.settle_result(grant, reply, now)

    async def reconcile(
        self, grant: Grant, actual: Usage, *, now: float | None = None
    ) -> ReconcileResult:
        return await self._settle(grant, actual, now)

    async def release(self, grant: Grant, *, now: float | None = None) -> ReconcileResult:
        return await self._settle(grant, None, now)

    async def extend(self, grant: Grant, more: Usage, *, now: float | None = None) -> Extension:
        specs = [p.bucket for p in grant.parts]
        skey, definition = self.specs(specs, self._local_now(now))
        keys = [self._epoch, self._index, skey]
        args: list[str | bytes] = [self._clock_arg(now), grant.reservation_id, b""]
        args += (repr(extension_amount(spec, more)) for spec in specs)
        reply = await self.call_specs("extend", keys, args, SPEC_ARG["extend"], skey, definition)
        self._learn_clock(f_(reply[1]), now)
        return parse_extend(grant, reply)

    async def renew(
        self, grant: Grant, *, now: float | None = None, lease_seconds: float | None = None
    ) -> RenewResult:
        lease = self.lease_seconds if lease_seconds is None else lease_seconds
        skey, definition = self.specs([p.bucket for p in grant.parts], self._local_now(now))
        keys = [self._epoch, self._record_key(grant), self._index, skey]
        args: list[str | bytes] = [
            self._clock_arg(now),
            grant.reservation_id,
            repr(float(lease)),
            self._retention,
            self._max_lease,
            repr(grant.created_at),
            b"",  # the definitions are read only to adopt a lost lease: sent when asked for
        ]
        for p in grant.parts:
            args += (repr(p.amount), repr(p.marker), "1" if p.skipped else "0")
        reply = await self._call("renew", keys, args)
        if _unknown_specs(reply):
            args[6] = definition
            reply = await self._call("renew", keys, args)
        return RenewResult(grant.reservation_id, Outcome(s_(reply[0])), f_(reply[1]))

    async def reap(self, *, now: float | None = None, limit: int = 100) -> list[ExpiredLease]:
        args = [self._clock_arg(now), self._max_lease, str(limit), self._retention]
        reply = await self._call("reap", [self._epoch, self._index], args)
        expired: list[ExpiredLease] = []
        at = 2
        for _ in range(int(reply[1])):
            rid, created, expires = s_(reply[at]), f_(reply[at + 1]), f_(reply[at + 2])
            n = int(reply[at + 3])
            taken = tuple((s_(reply[at + 4 + 2 * j]), f_(reply[at + 5 + 2 * j])) for j in range(n))
            expired.append(ExpiredLease(rid, created, expires, taken))
            at += 4 + 2 * n
        return expired

    async def pause(self, scope: str, until: float, *, now: float | None = None) -> float:
        args = [self._clock_arg(now), self._max_lease, repr(float(until))]
        return f_(await self._call("pause", [self._epoch, pause_key(self.prefix, scope)], args))

    async def observe(
        self,
        bucket: BucketSpec,
        *,
        remaining: float,
        reset_at: float = 0.0,
        now: float | None = None,
    ) -> float:
        blob, bkey, hkey, _ = self._bucket(bucket, self._local_now(now))
        args: list[str | bytes] = [
            self._clock_arg(now),
            self._max_lease,
            self._limit,
            blob,
            repr(float(remaining)),
            repr(float(reset_at)),
        ]
        return f_(await self._call("observe", [self._epoch, bkey, hkey], args))

    async def charge(
        self, parts: Sequence[tuple[BucketSpec, float]], *, now: float | None = None
    ) -> None:
        at = self._local_now(now)
        keys = [self._epoch]
        args: list[str | bytes] = [self._clock_arg(now), self._max_lease, self._limit]
        args.append(str(len(parts)))
        for spec, amount in parts:
            blob, bkey, hkey, _ = self._bucket(spec, at)
            keys += (bkey, hkey)
            args += (blob, repr(float(amount)))
        await self._call("charge", keys, args)

    async def levels(
        self, buckets: Sequence[BucketSpec], *, now: float | None = None
    ) -> list[BucketLevel]:
        at = self._local_now(now)
        keys = [self._epoch]
        args: list[str | bytes] = [self._clock_arg(now), self._max_lease, self._limit]
        args.append(str(len(buckets)))
        for spec in buckets:
            blob, bkey, hkey, pkey = self._bucket(spec, at)
            keys += (bkey, hkey, pkey)
            args.append(blob)
        reply = await self._call("levels", keys, args)
        self._learn_clock(f_(reply[0]), now)
        out = []
        for i, spec in enumerate(buckets):
            avail, full_at, paused, capacity = (f_(v) for v in reply[1 + 4 * i : 5 + 4 * i])
            out.append(BucketLevel(spec.name, capacity, avail, full_at, paused))
        return out
