"""The rate-limit broker as the request pipeline sees it (SPEC C3–C12, F2).

Thin async glue over the reservation store: which buckets apply to an attempt, what it
demands of them, admission, reconciliation, lease renewal for long requests, provider pauses
and header observations. The arithmetic lives in ``quotas.core``, atomicity in the Lua store.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from django.conf import settings

from common import redis as sy_redis
from quotas.core.estimate import Demand
from quotas.core.fairqueue import QueueRefusal
from quotas.core.jitter import jittered, pause_spread
from quotas.core.learned import asked_of, refusal_unexplained
from quotas.core.model import (
    Dimension,
    Grant,
    Outcome,
    ReconcileResult,
    Rule,
    Usage,
    sent_usage,
)
from quotas.core.observed import LimitObservation, RateLimitInfo
from quotas.core.observed import Usage as ProviderUsage
from quotas.queue import BrokerQueue
from quotas.snapshot import QuotaSnapshot, ScopedBucket
from quotas.store.queue_redis import RedisQueueStore
from quotas.store.redis import RedisReservationStore
from routing.catalogue import EndpointEntry
from tenants.identity import Principal

# Provider header dimensions → the canonical dimensions of the buckets they describe.
OBSERVED_DIMENSIONS = {
    "requests": (Dimension.REQUESTS,),
    "input_tokens": (Dimension.INPUT_TOKENS,),
    "output_tokens": (Dimension.OUTPUT_TOKENS,),
    "tokens": (Dimension.TOTAL_TOKENS,),
}
# Headers only matter when the provider is close to its limit: below this share remaining,
# they are worth a Redis call to tighten our view (C12); above it, our own count is tighter.
OBSERVE_BELOW_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class AttemptBuckets:
    """The buckets one attempt reserves in, narrowest first (D1)."""

    buckets: tuple[ScopedBucket, ...]
    provider_scope: str

    @property
    def specs(self) -> list:
        return [b.spec for b in self.buckets]

    def is_tenant_side(self, name: str) -> bool:
        return any(b.spec.name == name and b.tenant_side for b in self.buckets)


def attempt_buckets(
    quotas: QuotaSnapshot, principal: Principal, endpoint: EndpointEntry, model_id: int
) -> AttemptBuckets:
    scopes: list[tuple[str, int | None]] = [
        ("api_key", principal.key_id),
        ("app", principal.app_id),
        ("team", principal.team_id),
        ("tenant", principal.tenant_id),
        ("partner", principal.partner_id),
        ("provider", endpoint.provider.id),
        ("model", model_id),
    ]
    return AttemptBuckets(
        buckets=quotas.for_scopes(scopes), provider_scope=f"provider:{endpoint.provider.id}"
    )


def demand_usage(demand: Demand, endpoint: EndpointEntry) -> Usage:
    return Usage(
        requests=1.0,
        input_tokens=float(demand.input_tokens),
        output_tokens=float(demand.output_tokens),
        spend=demand.spend(price_input=endpoint.price_input, price_output=endpoint.price_output),
        concurrency=1.0,
    )


def actual_usage(usage: ProviderUsage, cost: float) -> Usage:
    return Usage(
        requests=1.0,
        input_tokens=float(usage.input_tokens),
        output_tokens=float(usage.output_tokens),
        spend=cost,
        concurrency=1.0,
        cached_input_tokens=float(usage.cached_input_tokens),
    )


@dataclass(frozen=True, slots=True)
class Turn:
    """A request's place in its pool's fair queue (D2, E1): max_depth 0 means "don't wait"."""

    flow: str
    weight: float
    deadline: float
    max_depth: int
    flow_depth: int


class Broker:
    def __init__(self, store: RedisReservationStore) -> None:
        self.store = store
        self.queue = BrokerQueue(RedisQueueStore(store), lease_seconds=store.lease_seconds)
        self.lease_seconds = store.lease_seconds
        self._rng = random.Random()
        self._background: set[asyncio.Task[None]] = set()

    async def admit(
        self, reservation_id: str, attempt: AttemptBuckets, demand: Usage, turn: Turn
    ) -> Grant | QueueRefusal:
        """Reserve in every bucket of the attempt, in fair turn among the pool's tenants."""
        if not attempt.buckets:  # nothing limits this request: no state to touch
            now = time.time()
            return Grant(reservation_id, now, now + self.lease_seconds, ())
        return await self.queue.admit(
            reservation_id,
            attempt.specs,
            demand,
            pool=attempt.provider_scope,
            flow=turn.flow,
            weight=turn.weight,
            deadline=turn.deadline,
            max_depth=turn.max_depth,
            flow_depth=turn.flow_depth,
        )

    async def reconcile(self, grant: Grant, actual: Usage) -> ReconcileResult:
        """C6: settle with actual usage; what comes back goes to the pool's next waiter."""
        if not grant.parts:
            return ReconcileResult(grant.reservation_id, Outcome.RECONCILED, time.time())
        return await self.queue.reconcile(grant, actual)

    async def release(self, grant: Grant, *, sent: Usage | None = None) -> ReconcileResult:
        """Settle a failed attempt: all of it comes back if nothing reached the provider;
        given the demand of an attempt that was ``sent``, all but its request and estimated
        spend (``sent_usage``), which a reconcile keeps exactly as reserved."""
        if not grant.parts:
            return ReconcileResult(grant.reservation_id, Outcome.RELEASED, time.time())
        if sent is not None:
            return await self.queue.reconcile(grant, sent_usage(sent))
        return await self.queue.release(grant)

    @contextlib.asynccontextmanager
    async def held(self, grant: Grant) -> AsyncIterator[None]:
        """Keep the lease alive while a long request or stream runs (C9, C10)."""
        if not grant.parts:
            yield
            return
        renewer = asyncio.create_task(self._renew_until_cancelled(grant))
        try:
            yield
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def _renew_until_cancelled(self, grant: Grant) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            with contextlib.suppress(Exception):  # a missed renewal only shortens the lease
                await self.store.renew(grant)

    async def pause_provider(self, attempt: AttemptBuckets, retry_after: float, now: float) -> None:
        """F2: Retry-After is a floor; bounded jitter spreads the waiters' wake-ups."""
        until = jittered(now + retry_after, spread=pause_spread(retry_after), rng=self._rng)
        await self.store.pause(attempt.provider_scope, until)

    async def observe_refusal(
        self, attempt: AttemptBuckets, demand: Usage, limits: RateLimitInfo
    ) -> bool:
        """A provider 429 that no limit in its headers explains cuts the learned concurrency
        limit of the provider account (``quotas.core.learned``); True if it was such a 429."""
        learned = [b.spec for b in attempt.buckets if b.spec.learned]
        if not learned:
            return False
        reported = [(o.remaining, asked_of(o.dimension, demand)) for o in limits.observations]
        if not refusal_unexplained(reported):
            return False
        for spec in learned:
            await self.store.observe(spec, remaining=0.0)
        return True

    def observe_later(self, attempt: AttemptBuckets, limits: RateLimitInfo) -> None:
        """C12, off the response path: tighten provider buckets from the provider's headers."""
        if any(self._worth_observing(o) for o in limits.observations):
            task = asyncio.create_task(self.observe(attempt, limits, time.time()))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    @staticmethod
    def _worth_observing(observation: LimitObservation) -> bool:
        return (
            observation.remaining is not None
            and bool(observation.limit)
            and observation.remaining <= OBSERVE_BELOW_SHARE * (observation.limit or 0)
        )

    async def observe(self, attempt: AttemptBuckets, limits: RateLimitInfo, now: float) -> None:
        """C12: tighten provider buckets from headers when the provider is nearly out."""
        for observation in limits.observations:
            if not self._worth_observing(observation):
                continue
            assert observation.remaining is not None
            for bucket in attempt.buckets:
                spec = bucket.spec
                if (
                    bucket.scope_kind == "provider"
                    and spec.rule is Rule.REFILL
                    and spec.dimension in OBSERVED_DIMENSIONS.get(observation.dimension, ())
                ):
                    reset_at = now + (observation.reset_after or 0.0)
                    await self.store.observe(
                        spec, remaining=observation.remaining, reset_at=reset_at
                    )


_broker: Broker | None = None


def broker_get() -> Broker:
    """This process's broker: one store over this process's async Redis client."""
    global _broker
    if _broker is None:
        store = RedisReservationStore(
            sy_redis.async_client(),
            prefix=settings.REDIS_PREFIX,
            lease_seconds=settings.RESERVATION_LEASE_SECONDS,
        )
        _broker = Broker(store)
    return _broker
