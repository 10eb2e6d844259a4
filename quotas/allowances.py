"""A gateway process's allowances (``quotas.core.allowance``): taken, handed out, reconciled.

One per bucket set (a request's buckets on one provider account) at a time. The flow:

- A request reserved on its own (``Broker.admit``) shows what its buckets have left. When
  every one of them could spare at least two more such requests and keep ``floor`` of its
  capacity, the process takes an allowance for the set in the background: one reservation of
  as many such requests as they can spare (``size`` at most, a tenth of any bucket at most;
  twice the request's tokens and spend each, ``allowance_unit``) that does not wait in the
  fair queue (refused at once if it does not fit).
- The set's next requests are granted from it, without Redis (``grant``), and settled into it
  (``settle``). A request that does not fit what is left reserves on its own, as before.
- A request of the process that reserved on its own and left one of the allowance's buckets
  under ``floor``, or was refused or queued on them (``contended``), stops the allowance: its
  set's requests then reserve on their own, through the fair queue.
- While a quarter or less of its requests is left, or ``RENEW_LEAD`` before its time is up
  if it granted any, the set takes the next one, which replaces it when it comes: the set's
  requests do not reserve on their own while an allowance is on its way. None is taken that
  would grant for less than ``MIN_LIFE`` (the end of a window, slice or ramp interval is that
  near): the set's requests reserve on their own until the next one begins.
- An allowance takes no more requests once it is ``WATCHED_MAX_AGE`` old (``MAX_AGE`` while
  no heartbeat watches for pauses, below), it granted none for ``IDLE_AFTER`` (its set went
  quiet: what it holds goes back), its window, slice or ramp interval is ending, a 429
  or a nearly empty provider stopped the account's, a pause was set anywhere (``watch``), it
  is spent (a new one is taken then, if the buckets are still plentiful), or the next one has
  come.
  When its last request has settled, its reservation is reconciled with what its requests
  used; until then its lease is renewed like a stream's.
- A process that stops reconciles its allowances (``close``); one that dies leaves them to
  their lease.

Pauses (F2). A request granted from an allowance reads no pause in Redis, so a pause another
process sets must reach this one's allowances some other way: each heartbeat
(``quotas.recovery``, about a second) reads how many pauses Redis has seen, and when the count
moved every allowance of the process grants no more (``watch``). Allowances therefore need not
end every second to bound how long a pause goes unseen; they live until spent or
``WATCHED_MAX_AGE``, which bounds how long an allowance's reservation is held before it is
reconciled with what its requests used. Each allowance costs Redis a take and a reconcile
(~0.25 ms each for a 13-bucket set), so at a few requests a second a set this is most of what
the broker costs Redis (``bench/results/redis.md``). A process whose heartbeat has not looked
for ``STALE_AFTER`` (or has none: tests, tools) ends its allowances after ``MAX_AGE``.

The setting ``BROKER_ALLOWANCE_REQUESTS`` is ``size`` (64; 0: no allowances).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.faultlog import faults
from quotas.core.allowance import (
    Allowance,
    allowance_unit,
    scaled,
    short,
    spare,
    suits,
    usable_until,
)
from quotas.core.book import actual_amount, reserve_amount
from quotas.core.model import (
    NOTHING,
    BucketSpec,
    Grant,
    GrantPart,
    Outcome,
    ReconcileResult,
    Settlement,
    Usage,
)
from quotas.metrics import BROKER_ALLOWANCE_GRANTS, BROKER_ALLOWANCES

log = logging.getLogger(__name__)

WATCHED_MAX_AGE = 5.0  # seconds an allowance grants at most while a heartbeat watches pauses
MAX_AGE = 1.0  # ... and while none does: how long a pause set elsewhere may go unseen
STALE_AFTER = 2.5  # a heartbeat that has not looked for this long no longer watches
# An allowance that granted no request for this long ends. Not shorter: a set's requests come
# in bursts (clients waiting on answers of the same length), and at one or two requests a second
# a set idled out of one-second allowances often enough to double its Redis calls.
IDLE_AFTER = 2.0
# An allowance that granted a request takes the next one this long before its time is up: no
# request may come meanwhile to ask for it, and it is there when the first one does.
RENEW_LEAD = 0.05
FLOOR = 0.5  # each bucket keeps at least this share of its capacity after an allowance
# No allowance is taken that could grant for less than this: near the end of a window, slice
# or ramp interval one would cost its take and reconcile and grant next to nothing, and each
# request it turns away (its time is up) asked for the next one (bench/results/redis.md).
MIN_LIFE = 0.25

Key = tuple[str, tuple[BucketSpec, ...]]


class Attempt(Protocol):
    """An attempt's buckets (``quotas.broker.AttemptBuckets``)."""

    @property
    def provider_scope(self) -> str: ...

    @property
    def specs(self) -> list[BucketSpec]: ...


class Place(Protocol):
    """A request's place in its pool's fair queue (``quotas.broker.Turn``)."""

    @property
    def flow(self) -> str: ...

    @property
    def weight(self) -> float: ...


class Owner(Protocol):
    """What allowances need of their process's broker (``quotas.broker.Broker``)."""

    async def allowance_take(
        self, reservation_id: str, attempt: Attempt, demand: Usage, place: Place
    ) -> Grant | None:
        """Reserve at once or not at all, never waiting in the fair queue."""
        ...

    def held(self, grant: Grant) -> AbstractAsyncContextManager[None]: ...

    async def reconcile(self, grant: Grant, actual: Usage) -> ReconcileResult: ...


@dataclass
class Held:
    """An allowance with the reservation it was taken as, and the request it was sized from
    (its attempt, demand and place: what its renewal is taken for)."""

    key: Key
    grant: Grant
    allowance: Allowance
    attempt: Attempt
    demand: Usage
    place: Place
    unwatched_until: float  # when it stops granting if the heartbeat stops looking
    last_granted: float  # when it granted a request (or was taken)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    idle: asyncio.TimerHandle | None = None  # when to look whether it went idle
    renewing: bool = False  # its next one was asked for; it replaces this one when it comes

    def close_if_done(self) -> None:
        if self.allowance.closable:
            self.closed.set()


class Allowances:
    """This process's allowances, on one event loop."""

    def __init__(self, broker: Owner, size: int, *, floor: float = FLOOR) -> None:
        self.broker = broker
        self.size = size
        self.floor = floor
        self._current: dict[Key, Held] = {}
        self._taking: set[Key] = set()
        self._granted: dict[str, tuple[Held, Usage]] = {}  # local reservation id → its allowance
        self._stops: dict[str, int] = {}  # provider scope → how many times a 429 stopped it
        self._pauses_moved = 0  # how many times a heartbeat saw a pause set anywhere
        self._pauses: int | None = None  # Redis's pause count at the last look
        self._watched_until = 0.0  # until when the last look vouches for the allowances
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _on_loop(self) -> None:
        """Allowances belong to the event loop that took them: another loop (a test's next
        ``asyncio.run``) starts with none, and leaves those of the one before to their lease."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._current, self._taking, self._granted, self._tasks = {}, set(), {}, set()
            self._stops, self._pauses_moved, self._pauses, self._watched_until = {}, 0, None, 0.0

    # -- requests ------------------------------------------------------------------------------

    def grant(
        self, reservation_id: str, attempt: Attempt, demand: Usage, place: Place
    ) -> Grant | None:
        """A grant from the set's allowance, or None: reserve on your own (a request larger
        than what is left does, and leaves the allowance to the smaller ones)."""
        self._on_loop()
        key = (attempt.provider_scope, tuple(attempt.specs))
        held = self._current.get(key)
        if held is None:
            return None
        now = time.time()
        if now >= held.unwatched_until and now >= self._watched_until:
            self._retire(held)  # no heartbeat looks for pauses: no longer than MAX_AGE
            return None
        allowance = held.allowance
        if not allowance.take(demand, now):
            if now >= allowance.usable_until:
                self._retire(held)
            elif allowance.spent:  # the next one is taken now, from what this one's grant showed
                self._retire(held)
                self._consider(key, attempt, demand, place, held.grant.parts)
            return None
        self._granted[reservation_id] = (held, demand)
        held.last_granted = now
        BROKER_ALLOWANCE_GRANTS.inc()
        if allowance.spent:
            self._retire(held)
            self._consider(key, attempt, demand, place, held.grant.parts)
        elif allowance.running_low:
            self._renew(held)
        left = Usage(**allowance.left)
        parts = tuple(
            GrantPart(
                p.bucket,
                reserve_amount(p.bucket, demand),
                marker=p.marker,
                # What Redis had left after the allowance, and what the allowance has left.
                remaining=(p.remaining or 0.0) + max(0.0, reserve_amount(p.bucket, left)),
            )
            for p in held.grant.parts
        )
        return Grant(reservation_id, now, held.grant.expires_at, parts)

    def learn(self, attempt: Attempt, demand: Usage, place: Place, grant: Grant) -> None:
        """A request reserved on its own: take an allowance for its set if its buckets show
        they can spare one."""
        if self.size <= 0 or grant.replayed:
            return
        self._on_loop()
        if contended := short(grant.parts, self.floor):
            self._step_aside(contended)
        key = (attempt.provider_scope, tuple(attempt.specs))
        held = self._current.get(key)
        if held is not None and not held.allowance.retired:
            return
        self._consider(key, attempt, demand, place, grant.parts)

    def _consider(
        self,
        key: Key,
        attempt: Attempt,
        demand: Usage,
        place: Place,
        parts: tuple[GrantPart, ...],
    ) -> None:
        if key in self._taking or not suits(attempt.specs, demand):
            return
        now = time.time()
        if usable_until(parts, now) - now < MIN_LIFE:
            return  # the first request of the next window, slice or interval asks again
        unit = allowance_unit(demand)
        size = spare(parts, unit, self.size, self.floor)
        if size:
            self._taking.add(key)
            self._later(self._take(key, attempt, demand, size, place))

    def owns(self, grant: Grant) -> bool:
        return grant.reservation_id in self._granted

    def settle(self, grant: Grant, actual: Usage | None) -> ReconcileResult:
        """Settle a request granted from an allowance (``actual`` None: released unsent)."""
        held, demand = self._granted.pop(grant.reservation_id)
        if actual is None:
            held.allowance.release(demand)
        else:
            held.allowance.settle(demand, actual)
        held.close_if_done()
        settlements = []
        for part in grant.parts:
            used = actual_amount(part.bucket, actual)
            settlements.append(
                Settlement(
                    part.bucket.name,
                    part.amount,
                    used,
                    released=max(0.0, part.amount - used),
                    charged=max(0.0, used - part.amount),
                )
            )
        outcome = Outcome.RELEASED if actual is None else Outcome.RECONCILED
        return ReconcileResult(grant.reservation_id, outcome, time.time(), tuple(settlements))

    def contended(self, attempt: Attempt) -> None:
        """A request on these buckets was refused or queued: the allowances that hold from
        any of them grant no more."""
        self._on_loop()
        self._step_aside(frozenset(attempt.specs))

    def _step_aside(self, buckets: frozenset[BucketSpec]) -> None:
        for held in list(self._current.values()):
            if not buckets.isdisjoint(held.key[1]):
                self._retire(held)

    def retire_scope(self, provider_scope: str) -> None:
        """A 429 or a nearly empty provider: the account's allowances grant no more, nor does
        one being taken now (``_take``)."""
        self._stops[provider_scope] = self._stops.get(provider_scope, 0) + 1
        for key, held in list(self._current.items()):
            if key[0] == provider_scope:
                self._retire(held)

    def watch(self, pauses: int, now: float) -> None:
        """A heartbeat read Redis's pause count (``recovery_look``). If it moved, a provider
        was paused somewhere since the last look: every allowance grants no more, and one on
        its way gives everything back (``_take``); the next requests reserve on their own, and
        the paused account's are refused. Until ``STALE_AFTER`` from ``now``, allowances taken
        may grant for ``WATCHED_MAX_AGE``."""
        self._on_loop()
        if self._pauses is not None and pauses != self._pauses:
            self._pauses_moved += 1
            for held in list(self._current.values()):
                self._retire(held)
        self._pauses = pauses
        self._watched_until = now + STALE_AFTER

    async def close(self) -> None:
        """Reconcile every allowance whose requests have ended (the process is stopping)."""
        for held in list(self._current.values()):
            self._retire(held)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)

    # -- allowances -----------------------------------------------------------------------------

    async def _take(
        self, key: Key, attempt: Attempt, demand: Usage, size: int, place: Place
    ) -> None:
        unit = allowance_unit(demand)
        rid = f"allowance:{uuid.uuid4().hex}"
        stops = (self._stops.get(attempt.provider_scope, 0), self._pauses_moved)
        try:
            result = await self.broker.allowance_take(rid, attempt, scaled(unit, size), place)
        except Exception:
            faults.warning(log, "allowance:redis", "an allowance could not be taken")
            return
        finally:
            self._taking.discard(key)
        if result is None or not result.parts:
            return
        if (self._stops.get(attempt.provider_scope, 0), self._pauses_moved) != stops:
            # A 429 or a pause came while it was on its way (Redis may have taken it before
            # the pause): it grants nothing and gives everything back at once.
            with contextlib.suppress(Exception):  # else its lease runs out
                await self.broker.reconcile(result, NOTHING)
            return
        created = result.created_at
        age = WATCHED_MAX_AGE if time.time() < self._watched_until else MAX_AGE
        until = min(usable_until(result.parts, created), created + age)
        allowance = Allowance(unit, size, until)
        held = Held(key, result, allowance, attempt, demand, place, created + MAX_AGE, created)
        BROKER_ALLOWANCES.inc()
        previous = self._current.get(key)
        if previous is not None:
            self._retire(previous)
        self._current[key] = held
        await self._hold(held, until)

    async def _hold(self, held: Held, until: float) -> None:
        """Keep the allowance's lease while it grants and while its requests run, then
        reconcile it with what they used."""
        loop = asyncio.get_running_loop()
        left = until - time.time()
        timers = (
            loop.call_later(max(0.0, left - RENEW_LEAD), self._renew_if_used, held),
            loop.call_later(max(0.0, left), self._retire, held),
        )
        held.idle = loop.call_later(IDLE_AFTER, self._end_if_idle, held)
        try:
            async with self.broker.held(held.grant):
                await held.closed.wait()
        finally:
            for timer in (*timers, held.idle):
                timer.cancel()
            if self._current.get(held.key) is held:
                del self._current[held.key]
        with contextlib.suppress(Exception):  # else its lease runs out: its takes stay counted
            await self.broker.reconcile(held.grant, held.allowance.actual())

    def _renew_if_used(self, held: Held) -> None:
        """Its time is nearly up: if it granted a request, the set takes the next one. A set
        no longer used stops after one allowance that grants nothing."""
        if held.allowance.granted > 0:
            self._renew(held)

    def _end_if_idle(self, held: Held) -> None:
        """Its set went quiet (no request granted for ``IDLE_AFTER``): what it holds goes back
        once its requests end, rather than sitting out its age; else look again then."""
        if held.allowance.retired:
            return
        quiet = time.time() - held.last_granted
        if quiet >= IDLE_AFTER:
            self._retire(held)
        else:
            loop = asyncio.get_running_loop()
            held.idle = loop.call_later(IDLE_AFTER - quiet, self._end_if_idle, held)

    def _renew(self, held: Held) -> None:
        """Take the next allowance, once, for the request this one was sized from; it replaces
        this one when it comes (``_take``). A refused renewal leaves the set to run out."""
        if not held.renewing and not held.allowance.retired:
            held.renewing = True
            self._consider(held.key, held.attempt, held.demand, held.place, held.grant.parts)

    def _retire(self, held: Held) -> None:
        held.allowance.retired = True
        if self._current.get(held.key) is held:
            del self._current[held.key]
        held.close_if_done()

    def _later(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
