"""The reservation store interface (SPEC C4–C12), async because the gateway's hot path is.

``now=None`` means "the store's clock": Redis's TIME for the Redis store, the injected clock
for the in-memory twin. Passing ``now`` drives either store on a simulated clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from quotas.core.fairqueue import Pumped, Queued, QueueReason, QueueRefusal
from quotas.core.model import (
    BucketLevel,
    BucketSpec,
    ExpiredLease,
    Extension,
    Grant,
    ReconcileResult,
    Refusal,
    RenewResult,
    Usage,
)


@dataclass(slots=True)
class LedgerCarry:
    """A ledger append that rides in a settle's round trip (gateway/ledger.py): ``settled`` (a
    record, or b'') gets the settle's outcome and settlements as a JSON trailer (queue_settle.lua)
    and is appended to the list ``key`` with ``records`` after it; ``writes`` (key, value, ms)
    are set; the birth mark at ``born_key`` is read, set to ``mark`` if missing, as an append
    does. A store that carried it fills in ``born``; one that cannot (the in-memory twin, a
    settle outside a pool) leaves it None, and the caller appends."""

    key: str
    born_key: str
    mark: bytes
    settled: bytes
    records: list[bytes] = field(default_factory=list)
    writes: list[tuple[str, bytes, int]] = field(default_factory=list)
    born: bytes | None = None


class ReservationStore(Protocol):
    async def bootstrap(self) -> bool:
        """Declare the store new (no learning period); False if it had state already."""
        ...

    async def reserve(
        self,
        reservation_id: str,
        buckets: Sequence[BucketSpec],
        demand: Usage,
        *,
        now: float | None = None,
        lease_seconds: float | None = None,
    ) -> Grant | Refusal:
        """All or nothing across ``buckets`` (narrowest first, D1); one atomic step."""
        ...

    async def reconcile(
        self, grant: Grant, actual: Usage, *, now: float | None = None
    ) -> ReconcileResult:
        """Replace the estimates by ``actual`` usage: release the rest, charge overage."""
        ...

    async def release(self, grant: Grant, *, now: float | None = None) -> ReconcileResult:
        """Give everything back (the request was never dispatched)."""
        ...

    async def extend(self, grant: Grant, more: Usage, *, now: float | None = None) -> Extension:
        """Take ``more`` from the buckets a live lease holds (a stream's next output step,
        C10 in steps), all or nothing; settling then reconciles against all it took. A lease
        no longer active (settled, expired, unknown) takes nothing."""
        ...

    async def renew(
        self, grant: Grant, *, now: float | None = None, lease_seconds: float | None = None
    ) -> RenewResult:
        """Extend the lease of a long request or stream."""
        ...

    async def reap(self, *, now: float | None = None, limit: int = 100) -> list[ExpiredLease]:
        """Expire abandoned leases whose time has passed (the periodic task calls this)."""
        ...

    async def pause(self, scope: str, until: float, *, now: float | None = None) -> float:
        """Refuse reservations touching ``scope`` until ``until``; returns the pause end."""
        ...

    async def observe(
        self,
        bucket: BucketSpec,
        *,
        remaining: float,
        reset_at: float = 0.0,
        now: float | None = None,
    ) -> float:
        """Tighten a provider bucket from its response headers; returns what is available."""
        ...

    async def charge(
        self, parts: Sequence[tuple[BucketSpec, float]], *, now: float | None = None
    ) -> None:
        """Charge usage that did not go through a reservation (debt allowed)."""
        ...

    async def levels(
        self, buckets: Sequence[BucketSpec], *, now: float | None = None
    ) -> list[BucketLevel]:
        """Available capacity and refill/reset time of each bucket."""
        ...


class QueueStore(Protocol):
    """The fair queue's atomic steps (``queue_redis.RedisQueueStore`` and its in-memory twin
    ``queue_memory.MemoryQueueStore``); ``quotas.queue.BrokerQueue`` waits on top of them."""

    mailbox: str

    def clock(self) -> float:
        """The store's clock (deadlines are absolute times on it)."""
        ...

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
        """Granted at once, refused at once, or waiting for a verdict in this mailbox;
        ``cost``: its virtual-time cost when it is not ``request_cost(demand)`` (a stream in
        steps reserves its first step and is charged its whole estimate)."""
        ...

    async def pump(self, pool: str, *, now: float | None = None) -> Pumped:
        """Hand out what fits to the pool's waiters, in virtual-time order."""
        ...

    async def leave(
        self, pool: str, reservation_id: str, *, reason: QueueReason, now: float | None = None
    ) -> Grant | QueueRefusal | None:
        """Leave the queue, unless the pump decided first (then that verdict)."""
        ...

    async def settle(
        self,
        grant: Grant,
        actual: Usage | None,
        *,
        pool: str | None,
        now: float | None = None,
        carry: LedgerCarry | None = None,
    ) -> tuple[ReconcileResult, Pumped | None]:
        """Reconcile (or release, ``actual=None``) and pump the pool in the same step; with
        ``carry``, append to the ledger in it too where the store can."""
        ...

    async def mail(self, *, timeout: float) -> list[tuple[str, Grant | QueueRefusal]]:
        """Verdicts for this mailbox's waiters; waits up to ``timeout`` s for the first."""
        ...

    def forget(self, reservation_id: str) -> None:
        """The waiter is done; later verdicts for it are dropped."""
        ...
