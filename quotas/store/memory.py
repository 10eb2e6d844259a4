"""The in-memory reservation store: the pure core's ``Book`` with a clock, sync for the
discrete-event simulator, plus ``AsyncMemoryStore`` so it also fits ``ReservationStore``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from quotas.core.book import Book
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


class MemoryReservationStore:
    """Same behaviour as the Redis store; ``now`` defaults to ``clock()`` (a simulator's)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        lease_seconds: float = 30.0,
        max_lease_seconds: float | None = None,
        retention_seconds: float = 300.0,
        expire_limit: int = 16,
        prefix: str = "sy",
    ) -> None:
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.book = Book(
            prefix=prefix,
            max_lease_seconds=max_lease_seconds or lease_seconds,
            retention_seconds=retention_seconds,
            expire_limit=expire_limit,
        )

    def _now(self, now: float | None) -> float:
        return self.clock() if now is None else now

    def bootstrap(self) -> bool:
        return False  # a new Book never lost anything

    def lose_state(self) -> None:
        """Simulate a Redis restart without persistence."""
        self.book.lose_state()

    def reserve(
        self,
        reservation_id: str,
        buckets: Sequence[BucketSpec],
        demand: Usage,
        *,
        now: float | None = None,
        lease_seconds: float | None = None,
    ) -> Grant | Refusal:
        lease = self.lease_seconds if lease_seconds is None else lease_seconds
        return self.book.reserve(
            reservation_id, buckets, demand, now=self._now(now), lease_seconds=lease
        )

    def reconcile(
        self, grant: Grant, actual: Usage, *, now: float | None = None
    ) -> ReconcileResult:
        return self.book.settle(grant, actual, now=self._now(now))

    def release(self, grant: Grant, *, now: float | None = None) -> ReconcileResult:
        return self.book.settle(grant, None, now=self._now(now))

    def extend(self, grant: Grant, more: Usage, *, now: float | None = None) -> Extension:
        return self.book.extend(grant, more, now=self._now(now))

    def renew(
        self, grant: Grant, *, now: float | None = None, lease_seconds: float | None = None
    ) -> RenewResult:
        lease = self.lease_seconds if lease_seconds is None else lease_seconds
        return self.book.renew(grant, now=self._now(now), lease_seconds=lease)

    def reap(self, *, now: float | None = None, limit: int = 100) -> list[ExpiredLease]:
        return self.book.reap(now=self._now(now), limit=limit)

    def pause(self, scope: str, until: float, *, now: float | None = None) -> float:
        return self.book.pause(scope, until, now=self._now(now))

    def observe(
        self,
        bucket: BucketSpec,
        *,
        remaining: float,
        reset_at: float = 0.0,
        now: float | None = None,
    ) -> float:
        return self.book.observe(bucket, remaining=remaining, reset_at=reset_at, now=self._now(now))

    def charge(
        self, parts: Sequence[tuple[BucketSpec, float]], *, now: float | None = None
    ) -> None:
        self.book.charge(parts, now=self._now(now))

    def levels(
        self, buckets: Sequence[BucketSpec], *, now: float | None = None
    ) -> list[BucketLevel]:
        return self.book.levels(buckets, now=self._now(now))


class AsyncMemoryStore:
    """The memory store behind the async ``ReservationStore`` interface (no I/O, no awaits)."""

    def __init__(self, store: MemoryReservationStore) -> None:
        self.store = store

    async def bootstrap(self) -> bool:
        return self.store.bootstrap()

    async def reserve(
        self,
        reservation_id: str,
        buckets: Sequence[BucketSpec],
        demand: Usage,
        *,
        now: float | None = None,
        lease_seconds: float | None = None,
    ) -> Grant | Refusal:
        return self.store.reserve(
            reservation_id, buckets, demand, now=now, lease_seconds=lease_seconds
        )

    async def reconcile(
        self, grant: Grant, actual: Usage, *, now: float | None = None
    ) -> ReconcileResult:
        return self.store.reconcile(grant, actual, now=now)

    async def release(self, grant: Grant, *, now: float | None = None) -> ReconcileResult:
        return self.store.release(grant, now=now)

    async def extend(self, grant: Grant, more: Usage, *, now: float | None = None) -> Extension:
        return self.store.extend(grant, more, now=now)

    async def renew(
        self, grant: Grant, *, now: float | None = None, lease_seconds: float | None = None
    ) -> RenewResult:
        return self.store.renew(grant, now=now, lease_seconds=lease_seconds)

    async def reap(self, *, now: float | None = None, limit: int = 100) -> list[ExpiredLease]:
        return self.store.reap(now=now, limit=limit)

    async def pause(self, scope: str, until: float, *, now: float | None = None) -> float:
        return self.store.pause(scope, until, now=now)

    async def observe(
        self,
        bucket: BucketSpec,
        *,
        remaining: float,
        reset_at: float = 0.0,
        now: float | None = None,
    ) -> float:
        return self.store.observe(bucket, remaining=remaining, reset_at=reset_at, now=now)

    async def charge(
        self, parts: Sequence[tuple[BucketSpec, float]], *, now: float | None = None
    ) -> None:
        self.store.charge(parts, now=now)

    async def levels(
        self, buckets: Sequence[BucketSpec], *, now: float | None = None
    ) -> list[BucketLevel]:
        return self.store.levels(buckets, now=now)
