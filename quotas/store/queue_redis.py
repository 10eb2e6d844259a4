"""The fair queue on Redis: one Lua call to enter (or be granted at once), one to pump, one to
leave, and settle.lua + the pump in one call (SPEC D2, E1, E6). The steps mirror
``quotas.core.queuebook.QueueBook``; ``lua/queue_lib.lua`` documents the keys.

Verdicts for waiters go to one mailbox list per gateway process (``mail`` reads it with
``BLPOP``), so a process with thousands of waiters holds one blocked connection, not
thousands. A verdict also stays in the entry's key for a while, so a waiter that leaves at
its deadline learns atomically whether the pump granted it first.

Liveness: ``<mailbox>:alive`` holds the time (on the scripts' clock) until which the mailbox
has a reader. The admit script sets it when a waiter joins; ``mail`` sets it on every call,
in the same round trip as its ``BLPOP`` (a pipeline), so the listener's refresh costs one
``SET`` per cycle and no round trip. The pump drops the waiters of a mailbox past its time.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quotas.core.book import demand_parts
from quotas.core.fairqueue import (
    MAILBOX_ALIVE_SECONDS,
    Pumped,
    Queued,
    QueueReason,
    QueueRefusal,
    Verdict,
    request_cost,
)
from quotas.core.model import (
    BucketRefusal,
    BucketSpec,
    Grant,
    Reason,
    ReconcileResult,
    Usage,
)
from quotas.store.base import LedgerCarry
from quotas.store.redis import SPEC_ARG, RedisReservationStore, queue_prefix
from quotas.store.wire import f_, parse_packed_grant, parse_reserve, s_

LUA = Path(__file__).with_name("lua")
SEP = b"\x1f"
MAIL_BATCH = 256
ADMIT_SPEC_ARG = 11  # queue_admit's ARGV[12]: the spec set's definition, or ''
# TTL of the alive key (queue_lib.lua's MAILBOX_MS): only to clean up after a dead process;
# the time the key holds says whether the mailbox is alive.
ALIVE_KEY_MS = 120_000


def reason_of(value: str) -> Reason | QueueReason:
    try:
        return QueueReason(value)
    except ValueError:
        return Reason(value)


def parse_refusal(rid: str, fields: Sequence[Any]) -> QueueRefusal:
    k = int(fields[6])
    rows = tuple(
        BucketRefusal(s_(fields[7 + 3 * i]), Reason(s_(fields[8 + 3 * i])), f_(fields[9 + 3 * i]))
        for i in range(k)
    )
    return QueueRefusal(
        rid,
        f_(fields[1]),
        reason_of(s_(fields[2])),
        s_(fields[3]),
        f_(fields[4]),
        s_(fields[5]),
        rows,
    )


class RedisQueueStore:
    """The fair queue's atomic steps on Redis, for one gateway process (one mailbox)."""

    def __init__(self, store: RedisReservationStore, *, mailbox: str | None = None) -> None:
        self.store = store
        self.client = store.client
        self.mailbox = f"{store.prefix}:mb:{mailbox or uuid.uuid4().hex}"
        self.alive_key = f"{self.mailbox}:alive"
        # Parts and lease of this process's waiters: a grant's reply is parsed against them.
        self._pending: dict[str, tuple[list[tuple[BucketSpec, float]], float]] = {}

    def clock(self) -> float:
        """This process's estimate of the Redis clock (deadlines are on it)."""
        return self.store.local_now()

    def _verdict(self, rid: str, raw: bytes | str) -> Verdict:
        data = raw.encode() if isinstance(raw, str) else raw
        if data[:1] == b"g":
            parts, lease = self._pending[rid]
            return parse_packed_grant(rid, data, parts, lease, SEP)
        fields = data.split(SEP)
        if fields[0] == b"Q":
            return parse_refusal(rid, fields)
        # a grant as text: reserve.lua's 'G' reply, from a pump of the version before
        parts, lease = self._pending[rid]
        grant = parse_reserve(rid, fields, parts, lease)
        assert isinstance(grant, Grant)
        return grant

    async def enter(
        self,
        reservation_id: str,
        buckets: Sequence[BucketSpec],
        demand: Usage,
        *,
        pool: str,
        flow: str,
        weight: float,
        deadline: float,
        max_depth: int,
        flow_depth: int,
        lease_seconds: float,
        burst: float,
        now: float | None = None,
        cost: float | None = None,
    ) -> Grant | QueueRefusal | Queued:
        """Granted at once, refused at once, or waiting (the verdict comes by ``mail``)."""
        parts = demand_parts(buckets, demand)
        at = self.store.local_now(now)
        (epoch, index), (clock, *_) = self.store.lease_args(now)
        skey, definition = self.store.specs(buckets, at, pool)
        # The pool's own keys are made from its qp in the script (like the entries' and
        # lanes'); qp and the store's settings are in the spec set: not sent on every call.
        keys = [epoch, index, skey]
        args: list[str | bytes] = [
            clock,
            reservation_id,
            flow,
            repr(float(weight)),
            repr(request_cost(demand) if cost is None else float(cost)),
            repr(float(burst)),
            repr(float(deadline)),
            repr(float(lease_seconds)),
            self.mailbox,
            str(int(max_depth)),
            str(int(flow_depth)),
            b"",
            *(repr(amount) for _, amount in parts),
        ]
        # Registered before the call: the verdict may reach the mailbox before the reply.
        self._pending[reservation_id] = (parts, float(lease_seconds))
        try:
            reply = await self.store.call_specs(
                "queue_admit", keys, args, ADMIT_SPEC_ARG, skey, definition
            )
        except BaseException:
            self._pending.pop(reservation_id, None)
            raise
        tag = s_(reply[0])
        if tag == "W":
            self.store.learn_clock(f_(reply[1]), now)
            return Queued(reservation_id, f_(reply[1]), s_(reply[2]), f_(reply[3]))
        if tag == "P":
            self._pending.pop(reservation_id, None)
            return parse_reserve(reservation_id, reply, parts, float(lease_seconds))  # type: ignore[return-value]
        verdict = self._verdict(reservation_id, reply[1])
        self._pending.pop(reservation_id, None)
        at = verdict.at if isinstance(verdict, QueueRefusal) else verdict.created_at
        self.store.learn_clock(at, now)
        return verdict

    def _pool_call(self, pool: str, now: float | None) -> tuple[list[str], list[str | bytes]]:
        (epoch, index), (clock, retention, max_lease, limit) = self.store.lease_args(now)
        qp = queue_prefix(self.store.prefix, pool)
        keys = [epoch, index, f"{qp}:s", f"{qp}:h", f"{qp}:l", f"{qp}:d"]
        return keys, [clock, qp, retention, max_lease, limit]

    @staticmethod
    def _pumped(reply: Sequence[Any]) -> Pumped:
        return Pumped(f_(reply[0]), f_(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]))

    async def pump(self, pool: str, *, now: float | None = None) -> Pumped:
        """Hand out what fits now; ``next_fit`` says when pumping again can help."""
        keys, args = self._pool_call(pool, now)
        pumped = self._pumped(await self.store.run_script("queue_pump", keys, args))
        self.store.learn_clock(pumped.at, now)
        return pumped

    async def leave(
        self, pool: str, reservation_id: str, *, reason: QueueReason, now: float | None = None
    ) -> Verdict | None:
        """Leave the queue, or get the verdict the pump reached first (None: none known)."""
        keys, args = self._pool_call(pool, now)
        args += (reservation_id, reason.value)
        reply = await self.store.run_script("queue_leave", keys, args)
        if s_(reply[0]) == "U":
            return None
        return self._verdict(reservation_id, reply[1])

    async def settle(
        self,
        grant: Grant,
        actual: Usage | None,
        *,
        pool: str | None,
        now: float | None = None,
        carry: LedgerCarry | None = None,
    ) -> tuple[ReconcileResult, Pumped | None]:
        """Reconcile (``actual``) or release (None), then pump the pool: one round trip, which
        also appends ``carry`` to the ledger (queue_settle.lua; not outside a pool)."""
        if pool is None:
            if actual is None:
                return await self.store.release(grant, now=now), None
            return await self.store.reconcile(grant, actual, now=now), None
        keys, args, skey, definition = self.store.settle_call(grant, actual, now, pool)
        if carry is not None:
            keys += (carry.key, carry.born_key)
            args += (carry.mark, carry.settled, str(len(carry.writes)))
            for key, value, ttl_ms in carry.writes:
                args += (key, value, str(ttl_ms))
            args += carry.records
        reply = await self.store.call_specs(
            "queue_settle", keys, args, SPEC_ARG["settle"], skey, definition
        )
        if carry is not None:
            carry.born = bytes(reply[2])
        return self.store.settle_result(grant, reply[0], now), self._pumped(reply[1])

    def _alive_until(self, now: float | None) -> str:
        return repr(self.store.local_now(now) + MAILBOX_ALIVE_SECONDS)

    async def keep_alive(self, *, now: float | None = None) -> None:
        """Mark this mailbox alive (``mail`` does it too, without a round trip of its own)."""
        await self.client.set(self.alive_key, self._alive_until(now), px=ALIVE_KEY_MS)

    async def mail(self, *, timeout: float, now: float | None = None) -> list[tuple[str, Verdict]]:
        """Verdicts for this process's waiters; blocks up to ``timeout`` s (> 0) for the first.
        Marks the mailbox alive in the same round trip."""
        raw: list[Any] = []
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.alive_key, self._alive_until(now), px=ALIVE_KEY_MS)
        if timeout > 0:
            pipe.blpop([self.mailbox], timeout=timeout)
            _, first = await pipe.execute()
            if first is None:
                return []
            raw.append(first[1])
            more: Any = await self.client.lpop(self.mailbox, MAIL_BATCH)
        else:
            pipe.lpop(self.mailbox, MAIL_BATCH)
            _, more = await pipe.execute()
        if more:
            raw += more
        out: list[tuple[str, Verdict]] = []
        for item in raw:
            rid_b, _, verdict = (item if isinstance(item, bytes) else item.encode()).partition(SEP)
            rid = rid_b.decode()
            if rid in self._pending:
                out.append((rid, self._verdict(rid, verdict)))
        return out

    def forget(self, reservation_id: str) -> None:
        """The waiter is done: verdicts for it that still arrive are dropped."""
        self._pending.pop(reservation_id, None)
