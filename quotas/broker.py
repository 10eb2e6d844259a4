"""The rate-limit broker as the request pipeline sees it (SPEC C3–C12, F2).

Thin async glue over the reservation store: which buckets apply to an attempt, what it
demands of them, admission, reconciliation, lease renewal for long requests, provider pauses
and header observations. The arithmetic lives in ``quotas.core``, atomicity in the Lua store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings

from common import redis as sy_redis
from common.faultlog import faults
from quotas.allowances import Allowances, Attempt, Place
from quotas.core.estimate import Demand
from quotas.core.fairqueue import QueueRefusal
from quotas.core.jitter import jittered, pause_spread
from quotas.core.keypool import OUT_SECONDS, KeyPool, room_left
from quotas.core.learned import asked_of, refusal_unexplained
from quotas.core.model import (
    BucketSpec,
    Dimension,
    Extension,
    Grant,
    Outcome,
    Reason,
    ReconcileResult,
    Rule,
    Usage,
    sent_usage,
)
from quotas.core.observed import LimitObservation, RateLimitInfo
from quotas.core.observed import Usage as ProviderUsage
from quotas.core.recovery import REPORT_SECONDS
from quotas.queue import BrokerQueue
from quotas.snapshot import PROVIDER_SIDE, SCOPE_ORDER, QuotaSnapshot, ScopedBucket
from quotas.store.base import LedgerCarry
from quotas.store.queue_redis import RedisQueueStore
from quotas.store.redis import RedisReservationStore
from routing.catalogue import CredentialEntry, EndpointEntry, ProviderEntry
from tenants.identity import Principal

log = logging.getLogger(__name__)

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


class RecoveryView(Protocol):
    """What the request path reads of this process's recovery (``quotas.recovery``): memory
    only, never a database query or a Redis call."""

    reported_born: float  # the birth of the epoch this process last reported in (-inf: none)

    @property
    def expected_end(self) -> float | None: ...

    def poke(self) -> None: ...


# The scopes of one key of a pool: a refusal by one of them leaves the pool's other keys a
# chance (another key, another project), a refusal by any wider one does not.
KEY_SCOPES = frozenset({"credential", "project"})


@dataclass(frozen=True, slots=True)
class AttemptBuckets:
    """The buckets one attempt reserves in, narrowest first (D1), and the pool key it uses."""

    buckets: tuple[ScopedBucket, ...]
    provider_scope: str
    credential: CredentialEntry | None = None

    @property
    def specs(self) -> list:
        return [b.spec for b in self.buckets]

    @property
    def credential_scope(self) -> str | None:
        """The key's own scope (its pause key), or None for an account's single key."""
        if self.credential is None or self.credential.id is None:
            return None
        return f"credential:{self.credential.id}"

    def is_tenant_side(self, name: str) -> bool:
        return any(b.spec.name == name and b.tenant_side for b in self.buckets)

    def is_key_side(self, name: str) -> bool:
        """Refused by the key's own bucket or its project's: another key may have room."""
        return any(b.spec.name == name and b.scope_kind in KEY_SCOPES for b in self.buckets)


def attempt_scopes(
    principal: Principal,
    endpoint: EndpointEntry,
    model_id: int,
    credential: CredentialEntry | None = None,
) -> list[tuple[str, int | None]]:
    """The scope nodes an attempt reserves in, narrowest first (D1, ``SCOPE_ORDER``)."""
    return [
        ("api_key", principal.key_id),
        ("app", principal.app_id),
        ("team", principal.team_id),
        ("tenant", principal.tenant_id),
        ("partner", principal.partner_id),
        ("credential", credential.id if credential is not None else None),
        ("project", credential.project_id if credential is not None else None),
        ("endpoint", endpoint.id),
        ("provider", endpoint.provider.id),
        ("model", model_id),
    ]


def attempt_buckets(
    quotas: QuotaSnapshot,
    principal: Principal,
    endpoint: EndpointEntry,
    model_id: int,
    credential: CredentialEntry | None = None,
) -> AttemptBuckets:
    scopes = attempt_scopes(principal, endpoint, model_id, credential)
    return AttemptBuckets(
        buckets=quotas.for_scopes(scopes),
        provider_scope=f"provider:{endpoint.provider.id}",
        credential=credential,
    )


def key_room(attempt: AttemptBuckets, grant: Grant) -> float | None:
    """The share left of the key's tightest own bucket after ``grant`` (None: it has none)."""
    parts = [
        (part.remaining, bucket.spec.capacity)
        for bucket, part in zip(attempt.buckets, grant.parts, strict=False)
        if bucket.scope_kind == "credential" and bucket.spec.rule is not Rule.RAMP
    ]
    return room_left(parts)


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
    # Its virtual-time cost when not its demand's: a stream in steps (C10) reserves its first
    # step but is charged its whole estimate, as a stream that reserves the maximum is, so
    # reserving in steps buys capacity, not a larger share of a contended pool.
    cost: float | None = None


class Holdings:
    """The reservations this process holds: granted and not yet settled, with their lease's
    end as last known. After Redis lost its state the process re-registers them
    (``quotas.recovery``); a lease that ran out is forgotten (C9: it holds nothing anywhere)."""

    def __init__(self) -> None:
        self._grants: dict[str, tuple[Grant, float]] = {}

    def add(self, grant: Grant) -> None:
        self._grants[grant.reservation_id] = (grant, grant.expires_at)

    def settled(self, grant: Grant) -> None:
        self._grants.pop(grant.reservation_id, None)

    def extended(self, grant: Grant) -> None:
        """A stream's lease took another step: re-registered with its new amounts."""
        held = self._grants.get(grant.reservation_id)
        if held is not None:
            self._grants[grant.reservation_id] = (grant, held[1])

    def renewed(self, grant: Grant, expires_at: float) -> None:
        if grant.reservation_id in self._grants:
            self._grants[grant.reservation_id] = (grant, expires_at)

    def held(self, now: float) -> list[Grant]:
        """What is held at ``now`` (the expired are dropped)."""
        for rid in [rid for rid, (_, until) in self._grants.items() if until <= now]:
            del self._grants[rid]
        return [grant for grant, _ in self._grants.values()]


@dataclass(eq=False)
class HeldLease:
    grant: Grant
    due: float  # loop time of its next renewal
    renewal: asyncio.Task[None] | None = None


class LeaseKeeper:
    """Renews the leases held on one event loop (``Broker.held``) from one task: each a third
    of a lease after it was taken or last renewed, as a task per lease did. A task, an event
    and a timer per request cost more than the renewals: a request shorter than a third of a
    lease (10 s) is never renewed. Leases are kept in the order they fall due (each new or
    renewed one is due last), so the task sleeps until the first and wakes about once per
    third of a lease when requests are short."""

    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.leases: dict[HeldLease, None] = {}  # insertion order = due order
        self._task: asyncio.Task[None] | None = None

    def hold(self, grant: Grant) -> HeldLease:
        lease = HeldLease(grant, self.loop.time() + self.broker.lease_seconds / 3)
        self.leases[lease] = None
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._renewing())
        return lease

    async def release(self, lease: HeldLease) -> None:
        """The request is over: no renewal after this returns (one under way is cancelled and
        waited for, so it cannot reach Redis after the settle)."""
        self.leases.pop(lease, None)
        renewal = lease.renewal
        if renewal is not None and not renewal.done():
            renewal.cancel()
            # asyncio.wait, not ``await renewal`` under suppress(CancelledError): that would
            # also swallow a cancellation of this request itself (its client going away).
            await asyncio.wait([renewal])

    async def _renewing(self) -> None:
        third = self.broker.lease_seconds / 3
        while self.leases:
            first = next(iter(self.leases))
            now = self.loop.time()
            if first.due > now:
                await asyncio.sleep(first.due - now)
                continue  # the first may have ended meanwhile
            del self.leases[first]
            first.due = now + third
            self.leases[first] = None  # due last again
            if first.renewal is None or first.renewal.done():
                first.renewal = self.loop.create_task(self.broker.renew(first.grant))


class Broker:
    def __init__(self, store: RedisReservationStore, *, allowance_requests: int = 0) -> None:
        self.store = store
        self.queue = BrokerQueue(RedisQueueStore(store), lease_seconds=store.lease_seconds)
        self.lease_seconds = store.lease_seconds
        self.holdings = Holdings()
        # Set by this process's membership (quotas/recovery.py), when it has one.
        self.recovery: RecoveryView | None = None
        self._rng = random.Random()
        self._background: set[asyncio.Task[None]] = set()
        # B2: what this process knows of every pooled key's room and health.
        self.keys = KeyPool()
        self._keeper: LeaseKeeper | None = None
        # Requests granted from this process's allowances, while their buckets are plentiful.
        self.allowances = Allowances(self, allowance_requests) if allowance_requests else None

    # -- key pools (B2) ------------------------------------------------------------------------

    def key_order(self, provider: ProviderEntry, now: float) -> list[CredentialEntry]:
        """The keys of ``provider``'s pool to try, best first (``KeyPool.order``)."""
        pool = provider.pool
        if len(pool) == 1:
            return list(pool)
        return self.keys.order(pool, now, self._rng)

    def key_granted(self, attempt: AttemptBuckets, grant: Grant, now: float) -> None:
        if attempt.credential is not None and len(grant.parts) == len(attempt.buckets):
            self.keys.granted(attempt.credential, key_room(attempt, grant), now)

    def key_full(self, attempt: AttemptBuckets, retry_at: float, now: float) -> None:
        if attempt.credential is not None:
            self.keys.full(attempt.credential, retry_at, now)

    def keys_usable(self, provider: ProviderEntry, now: float) -> int:
        return self.keys.usable(provider.pool, now)

    async def key_failed(self, attempt: AttemptBuckets, why: str, now: float) -> None:
        """The provider refused the attempt's key (401, 403): out of this process's pool at
        once; and its own scope is paused in Redis, so every other process's reservation on
        it (when it has buckets) is refused and moves to another key as well."""
        credential = attempt.credential
        if credential is None:
            return
        self.keys.failed(credential, now, why)
        if self.allowances is not None:
            self.allowances.retire_scope(attempt.provider_scope)
        scope = attempt.credential_scope
        if scope is not None:
            with contextlib.suppress(Exception):  # the local eviction already holds
                await self.store.pause(scope, now + OUT_SECONDS)

    async def admit(
        self, reservation_id: str, attempt: AttemptBuckets, demand: Usage, turn: Turn
    ) -> Grant | QueueRefusal:
        """Reserve in every bucket of the attempt, in fair turn among the pool's tenants."""
        if not attempt.buckets:  # nothing limits this request: no state to touch
            now = time.time()
            return Grant(reservation_id, now, now + self.lease_seconds, ())
        allowances = self.allowances
        if allowances is not None:
            granted = allowances.grant(reservation_id, attempt, demand, turn)
            if granted is not None:
                return granted
        result = await self._enter(reservation_id, attempt, demand, turn)
        if isinstance(result, Grant):
            if result.state == "active":  # a replay of a settled one holds nothing
                self.holdings.add(result)
                if allowances is not None:
                    allowances.learn(attempt, demand, turn, result)
            if self.recovery is not None and result.created_at < self.recovery.reported_born:
                # Granted by the lost state, its answer read after this process reported.
                self._later(self._adopt(result))
        else:
            if allowances is not None:
                allowances.contended(attempt)
            if result.reason is Reason.RECOVERING:
                result = self._recovering(result)
        return result

    async def allowance_take(
        self, reservation_id: str, attempt: Attempt, demand: Usage, place: Place
    ) -> Grant | None:
        """An allowance's reservation (``quotas.allowances``): granted at once or refused,
        never waiting in the fair queue — it is taken only while there is plenty."""
        no_wait = Turn(place.flow, place.weight, time.time() + 1.0, max_depth=0, flow_depth=0)
        result = await self._enter(reservation_id, attempt, demand, no_wait)
        if not isinstance(result, Grant) or result.state != "active":
            return None
        self.holdings.add(result)
        return result

    async def _enter(
        self, reservation_id: str, attempt: Attempt, demand: Usage, turn: Turn
    ) -> Grant | QueueRefusal:
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
            cost=turn.cost,
        )

    def _allowance_of(self, grant: Grant) -> Allowances | None:
        """This process's allowances, if ``grant`` came from one (no reservation of its own)."""
        allowances = self.allowances
        return allowances if allowances is not None and allowances.owns(grant) else None

    def _recovering(self, refusal: QueueRefusal) -> QueueRefusal:
        """A refusal while the state is relearnt says when that is expected to end (not the
        learning period's conservative bound), and gets this process to look at once."""
        recovery = self.recovery
        expected = recovery.expected_end if recovery is not None else None
        if recovery is not None:
            recovery.poke()
        end = min(refusal.retry_at, expected or refusal.at + REPORT_SECONDS)
        faults.warning(
            log,
            "broker:recovering",
            "refusing requests with reason 'recovering': the broker's Redis state is new or was "
            "lost, and the processes that may hold reservations have not all re-registered "
            "them yet (expected in %.1f s; see switchyard_broker_recovering)",
            max(0.0, end - refusal.at),
            exc_info=False,
        )
        return dataclasses.replace(refusal, retry_at=max(refusal.at, end))

    async def _adopt(self, grant: Grant) -> None:
        with contextlib.suppress(Exception):  # its renewals adopt it too, within a third of a lease
            result = await self.store.renew(grant)
            self.holdings.renewed(grant, result.expires_at)

    def _later(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def reconcile(
        self, grant: Grant, actual: Usage, *, carry: LedgerCarry | None = None
    ) -> ReconcileResult:
        """C6: settle with actual usage; what comes back goes to the pool's next waiter.
        ``carry``: the answer's ledger records, appended in the same round trip where the
        store can (then ``carry.born`` is set; else the caller appends them)."""
        if not grant.parts:
            return ReconcileResult(grant.reservation_id, Outcome.RECONCILED, time.time())
        if (allowances := self._allowance_of(grant)) is not None:
            return allowances.settle(grant, actual)  # ``carry`` is left to the caller
        self.holdings.settled(grant)
        return await self.queue.reconcile(grant, actual, carry=carry)

    async def release(self, grant: Grant, *, sent: Usage | None = None) -> ReconcileResult:
        """Settle a failed attempt: all of it comes back if nothing reached the provider;
        given the demand of an attempt that was ``sent``, all but its request and estimated
        spend (``sent_usage``), which a reconcile keeps exactly as reserved."""
        if not grant.parts:
            return ReconcileResult(grant.reservation_id, Outcome.RELEASED, time.time())
        if (allowances := self._allowance_of(grant)) is not None:
            return allowances.settle(grant, None if sent is None else sent_usage(sent))
        self.holdings.settled(grant)
        if sent is not None:
            return await self.queue.reconcile(grant, sent_usage(sent))
        return await self.queue.release(grant)

    async def extend(self, grant: Grant, more: Usage) -> Extension:
        """C10 in steps: take a stream's next output step from every bucket its lease holds,
        all or nothing, in one round trip; settling then reconciles against all it took."""
        if not grant.parts:  # nothing limits this request
            return Extension(grant.reservation_id, Outcome.EXTENDED, time.time(), grant=grant)
        if self._allowance_of(grant) is not None:
            # Never granted to a stream in steps (``quotas.core.allowance.suits``).
            return Extension(grant.reservation_id, Outcome.UNKNOWN, time.time())
        result = await self.store.extend(grant, more)
        if result.grant is not None:
            self.holdings.extended(result.grant)
        return result

    @contextlib.asynccontextmanager
    async def held(self, grant: Grant) -> AsyncIterator[None]:
        """Keep the lease alive while a long request or stream runs (C9, C10): renewed a third
        of a lease after it is taken, then every third, by this loop's ``LeaseKeeper``."""
        if not grant.parts or self._allowance_of(grant) is not None:
            yield  # an allowance's request: the allowance keeps its own lease
            return
        loop = asyncio.get_running_loop()
        keeper = self._keeper
        if keeper is None or keeper.loop is not loop:  # a new loop (tests): its own keeper
            keeper = self._keeper = LeaseKeeper(self, loop)
        lease = keeper.hold(grant)
        try:
            yield
        finally:
            await keeper.release(lease)

    async def renew(self, grant: Grant) -> None:
        """One renewal of a held lease; a failed one only shortens it."""
        with contextlib.suppress(Exception):
            result = await self.store.renew(grant)
            self.holdings.renewed(grant, result.expires_at)
            if result.outcome is Outcome.ADOPTED and self.recovery is not None:
                self.recovery.poke()  # the state was lost: report now, not at the next beat

    async def pause_provider(
        self,
        attempt: AttemptBuckets,
        retry_after: float,
        now: float,
        *,
        demand: Usage | None = None,
        limits: RateLimitInfo | None = None,
    ) -> None:
        """F2: Retry-After is a floor; bounded jitter spreads the waiters' wake-ups.

        What is paused is the scope the 429 describes (``refused_scope``): one key of a pool
        when its headers say its own limit refused, else the whole provider account."""
        until = jittered(now + retry_after, spread=pause_spread(retry_after), rng=self._rng)
        if self.allowances is not None:
            self.allowances.retire_scope(attempt.provider_scope)
        scope = attempt.provider_scope
        if demand is not None and limits is not None:
            scope = refused_scope(attempt, demand, limits)
        if scope != attempt.provider_scope:
            self.key_full(attempt, until, now)
        await self.store.pause(scope, until)

    async def observe_refusal(
        self, attempt: AttemptBuckets, demand: Usage, limits: RateLimitInfo
    ) -> bool:
        """A provider 429 that no limit in its headers explains cuts the learned concurrency
        limit of the provider account (``quotas.core.learned``); True if it was such a 429."""
        if self.allowances is not None:  # a provider 429: its allowances grant no more
            self.allowances.retire_scope(attempt.provider_scope)
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
            self._later(self.observe(attempt, limits, time.time()))

    @staticmethod
    def _worth_observing(observation: LimitObservation) -> bool:
        return (
            observation.remaining is not None
            and bool(observation.limit)
            and observation.remaining <= OBSERVE_BELOW_SHARE * (observation.limit or 0)
        )

    async def observe(self, attempt: AttemptBuckets, limits: RateLimitInfo, now: float) -> None:
        """C12: tighten provider buckets from headers when the provider is nearly out."""
        if self.allowances is not None:
            self.allowances.retire_scope(attempt.provider_scope)
        for observation in limits.observations:
            if not self._worth_observing(observation):
                continue
            assert observation.remaining is not None
            for spec in observed_buckets(attempt, observation.dimension):
                reset_at = now + (observation.reset_after or 0.0)
                await self.store.observe(spec, remaining=observation.remaining, reset_at=reset_at)


def observed_buckets(attempt: AttemptBuckets, dimension: str) -> list[BucketSpec]:
    """The buckets a provider header of ``dimension`` describes: the refill buckets of that
    dimension in the narrowest provider-side scope of the attempt that has any (D1 order).

    A provider's headers describe the limit that binds the key they were sent with: the key's
    own when it has one of that dimension, else its project's, else the organisation's
    (per model, then overall). So a key's headers tighten that key's bucket only, never the
    organisation's shared one, and an account without pooled keys works as before.
    """
    wanted = OBSERVED_DIMENSIONS.get(dimension, ())
    found: dict[str, list[BucketSpec]] = {}
    for bucket in attempt.buckets:
        spec = bucket.spec
        if (
            bucket.scope_kind in PROVIDER_SIDE
            and spec.rule is Rule.REFILL
            and spec.dimension in wanted
            and not spec.learned
        ):
            found.setdefault(bucket.scope_kind, []).append(spec)
    for kind in SCOPE_ORDER:
        if kind in found:
            return found[kind]
    return []


def refused_scope(attempt: AttemptBuckets, demand: Usage, limits: RateLimitInfo) -> str:
    """The scope a provider 429 refused in: the key's own (or its project's) when every limit
    its headers report short of what the attempt asked is one of the key's buckets
    (``observed_buckets``); otherwise — the organisation's limit, or headers that explain
    nothing — the provider account, as before pools."""
    scopes: set[str] = set()
    for observation in limits.observations:
        remaining = observation.remaining
        if remaining is None or remaining >= asked_of(observation.dimension, demand):
            continue
        described = observed_buckets(attempt, observation.dimension)
        if not described:
            return attempt.provider_scope
        scopes |= {spec.scope for spec in described}
    key_scopes = {f"{kind}:" for kind in KEY_SCOPES}
    if len(scopes) == 1:
        [scope] = scopes
        if any(scope.startswith(prefix) for prefix in key_scopes):
            return scope
    return attempt.provider_scope


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
        _broker = Broker(store, allowance_requests=settings.BROKER_ALLOWANCE_REQUESTS)
    return _broker


async def broker_close() -> None:
    """The process is stopping: its allowances are reconciled now rather than left to their
    lease (one whose requests are still running after a few seconds is left to it)."""
    if _broker is not None and _broker.allowances is not None:
        await _broker.allowances.close()
