"""The reservation store interface (SPEC C4–C12), async because the gateway's hot path is.

``now=None`` means "the store's clock": Redis's TIME for the Redis store, the injected clock
for the in-memory twin. Passing ``now`` drives either store on a simulated clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from quotas.core.model import (
    BucketLevel,
    BucketSpec,
    ExpiredLease,
    Grant,
    ReconcileResult,
    Refusal,
    RenewResult,
    Usage,
)


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
