"""Broker state that heals itself, in a process that can hold reservations (SPEC C9, I2).

A gateway process (``gateway/asgi.py``'s lifespan) and a Celery worker's job loop
(``gateway/job_runner.py``) each *join* as a member: a row in PostgreSQL (``BrokerMember``)
that a background task heartbeats every ``HEARTBEAT_SECONDS``. The same task looks at the
broker's epoch in Redis (one script call, sent in an answer's ledger append when one comes in
time: ``look_ride``), which also tells the process's allowances how many provider pauses were
set (``quotas.allowances``: a pause set elsewhere stops them). When the
epoch is learning — Redis is new, or lost its state — the member

1. re-registers every reservation it holds (``Broker.holdings``) in the new Redis: a renewal
   of a lease the store does not know *adopts* it, holding its concurrency again without a
   capacity check (it is already out);
2. reports in the epoch that it did;
3. reads the members' rows and decides (``quotas.core.recovery``) whether the learning period
   may end, and if so ends it.

So a new deployment ends it at once (a new process reports before it registers: it holds
nothing), and a lost state as soon as every live process has reported — seconds, not a lease.
Refusals meanwhile carry reason ``recovering`` and the expected end (``Broker._recovering``),
``switchyard_broker_recovering`` is 1, and the log says why. None of this is on the request
path: a request reads at most this object's memory.

Without PostgreSQL the member cannot decide and the epoch ends by itself one maximum lease
after its birth, as it always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from common.db import database_work
from common.faultlog import faults
from quotas import metrics
from quotas.broker import Broker, broker_get
from quotas.core.model import Outcome
from quotas.core.recovery import HEARTBEAT_SECONDS, Member, Verdict, recovery_decide
from quotas.models import BrokerMember
from quotas.store.redis import EpochState

log = logging.getLogger(__name__)

STARTUP_TIMEOUT = 5.0
# A look may ride an answer's round trip once this share of a heartbeat has passed since the
# last one, so that the beat finds it there (routing.live's sync rides the same way).
RIDE_SHARE = 0.8
POKE_GAP_SECONDS = 0.1  # a process starts without its first look rather than not at all
# Rows of members silent this long are deleted: they tell nothing any more (a day: what a
# refill bucket with a daily period would want to know of the last activity).
FORGET_AFTER_SECONDS = 86400.0


class Recovery:
    """This process's membership: its heartbeat, its reports, its part in ending a recovery."""

    def __init__(self, broker: Broker, kind: str) -> None:
        self.broker = broker
        self.store = broker.store
        self.member = f"{kind}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.reported_born = -math.inf
        self.verdict: Verdict | None = None  # the last decision on a learning epoch
        self._seen = False  # this process has said that the broker is learning
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._leaving = False
        self._looked_at = -math.inf  # when the last look was sent (monotonic), ridden or not
        self._ridden: tuple[EpochState, float] | None = None  # a ridden look, when it came

    @property
    def expected_end(self) -> float | None:
        return self.verdict.expected_end if self.verdict is not None else None

    def poke(self) -> None:
        """Look now, not at the next heartbeat (a refusal or an adoption said the state went)."""
        if self._wake is not None:
            self._wake.set()

    async def join(self) -> None:
        """Report (a new process holds nothing), register, decide; then heartbeat."""
        self._wake = asyncio.Event()
        self.broker.recovery = self
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                state = await self.store.recovery_look(self.member)
                self._looked(state)
                await self._touch_and_decide(state, joining=True)
        except Exception:
            faults.warning(log, "recovery:join", "broker membership: the first look failed")
        self._task = asyncio.get_running_loop().create_task(self._beating())

    async def leave(self) -> None:
        """Stop heartbeating; a member that holds nothing deletes its row (else the row stays,
        and a recovery counts its reservations in flight for one lease)."""
        if self._task is not None:
            # The flag as well as the cancel: a worker once hung at shutdown with its heartbeat
            # cancelled yet beating on, the cancel lost in something a beat awaited (1 stop in
            # ~35 while measuring; what lost it is not known). The loop ends at its next look.
            self._leaving = True
            if self._wake is not None:
                self._wake.set()
            self._task.cancel()
            await asyncio.wait([self._task])  # its end, not its CancelledError; ours goes up
        if not self.broker.holdings.held(self.store.local_now()):
            with contextlib.suppress(Exception):
                await database_work(_member_delete)(self.member)

    async def _beating(self) -> None:
        assert self._wake is not None
        while not self._leaving:
            poked = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    poked = await self._wake.wait()
            if self._leaving:
                return
            self._wake.clear()
            try:
                await self.beat(poked=poked)
            except asyncio.CancelledError:
                raise
            except Exception:
                faults.warning(log, "recovery:beat", "broker membership: the heartbeat failed")
            # Every refusal while recovering pokes: one look per gap, not one per refusal.
            await asyncio.sleep(POKE_GAP_SECONDS)

    async def beat(self, *, poked: bool = False) -> None:
        """One heartbeat: look at the epoch (or take the look that rode an answer's round trip
        since the last beat, unless ``poked``), report if it learns, write the row, decide."""
        state = None if poked else self._ridden_fresh()
        if state is None:
            self._looked_at = time.monotonic()
            state = await self.store.recovery_look()
            self._looked(state)
        if state.epoch.learning(state.now) and self.member not in state.reported:
            if not await self._reregister(state):
                return  # a renewal failed: not reported, try again at the next beat
            state = await self.store.recovery_look(self.member, epoch=state.epoch)
        await self._touch_and_decide(state, joining=False)

    def look_ride(self, pipe: Any) -> Callable[[list[Any]], None] | None:
        """If a look is due, add it to ``pipe`` (an answer's ledger append, not yet sent:
        ``gateway.ledger``) and return what takes its reply; else None. With answers coming,
        the heartbeat then needs no round trip of its own (its database row is another
        matter)."""
        if self._task is None or self._leaving:
            return None
        if time.monotonic() - self._looked_at < RIDE_SHARE * HEARTBEAT_SECONDS:
            return None
        self._looked_at = time.monotonic()
        pipe.execute_command(*self.store.recovery_look_command())
        return self._ridden_came

    def _ridden_came(self, replies: list[Any]) -> None:
        if isinstance(replies[0], Exception):
            return  # the beat looks on its own (and loads the library, if Redis lost it)
        state = self.store.recovery_state(replies[0])
        self._ridden = (state, time.monotonic())
        self._looked(state)

    def _ridden_fresh(self) -> EpochState | None:
        """The look that rode since the last beat, if it is younger than a heartbeat."""
        ridden, self._ridden = self._ridden, None
        if ridden is None or time.monotonic() - ridden[1] >= HEARTBEAT_SECONDS:
            return None
        return ridden[0]

    def _looked(self, state: EpochState) -> None:
        """Tell this process's allowances how many pauses Redis has seen: a pause another
        process set stops them here (``quotas.allowances``)."""
        if self.broker.allowances is not None:
            self.broker.allowances.watch(state.pauses, time.time())

    async def _reregister(self, state: EpochState) -> bool:
        """Adopt every reservation this process holds into the new state; True if all went."""
        held = self.broker.holdings.held(state.now)
        results = await asyncio.gather(
            *(self.store.renew(grant) for grant in held), return_exceptions=True
        )
        adopted = 0
        for grant, result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                return False
            self.broker.holdings.renewed(grant, result.expires_at)
            adopted += result.outcome is Outcome.ADOPTED
        self.reported_born = state.epoch.born
        log.warning(
            "broker state: re-registered %d of the %d reservations this process holds in the "
            "new Redis state (the rest it held already) and reported as %s",
            adopted,
            len(held),
            self.member,
        )
        return True

    async def _touch_and_decide(self, state: EpochState, *, joining: bool) -> None:
        learning = state.epoch.learning(state.now)
        members = await database_work(_member_touch)(
            self.member, self.store.local_now(), joining=joining, read=learning
        )
        if not learning:
            self._recovered()
            return
        now = self.store.local_now()
        verdict = recovery_decide(
            state.epoch, members, state.reported, now=now, max_lease=self.store.max_lease_seconds
        )
        self.verdict = verdict
        self._recovering(state, verdict, now)
        if verdict.ends_at is None:
            return
        moved = await self.store.recovery_end(state.epoch, until=verdict.ends_at, born=verdict.born)
        if not moved:
            return  # another member decided first, or the epoch is another one by now
        kind = "lost" if verdict.lost else "new"
        metrics.BROKER_RECOVERIES.labels(kind).inc()
        if verdict.ends_at <= now:
            log.warning(
                "broker state %s: learning period ended %.2f s after it began (%d processes "
                "reported; every live one's reservations are re-registered)",
                kind,
                now - state.epoch.born,
                len(state.reported),
            )
            self._recovered()
        else:
            log.warning(
                "broker state lost: learning period ends in %.1f s, when the reservations of "
                "processes that stopped without reporting have expired",
                verdict.ends_at - now,
            )

    def _recovering(self, state: EpochState, verdict: Verdict, now: float) -> None:
        metrics.BROKER_RECOVERING.set(1)
        if not self._seen:
            self._seen = True
            log.warning(
                "broker state: Redis holds a new epoch (its state is new or was lost). "
                "Concurrency and window limits refuse with reason 'recovering' until the "
                "processes that may hold reservations have re-registered them",
            )
        if verdict.waiting_for:
            faults.warning(
                log,
                "recovery:waiting",
                "broker state: waiting for %d live processes to report (%s); expected end "
                "in %.1f s",
                len(verdict.waiting_for),
                ", ".join(verdict.waiting_for[:5]),
                verdict.expected_end - now,
                exc_info=False,
            )

    def _recovered(self) -> None:
        self.verdict = None
        self._seen = False
        metrics.BROKER_RECOVERING.set(0)


def _member_touch(member: str, now: float, *, joining: bool, read: bool) -> list[Member]:
    """Write the member's row (a missing one is created); the members' rows if ``read``."""
    if joining:
        BrokerMember.objects.filter(last_seen__lt=now - FORGET_AFTER_SECONDS).delete()
    if not BrokerMember.objects.filter(pk=member).update(last_seen=now):
        BrokerMember.objects.create(id=member, started=now, last_seen=now)
    if not read:
        return []
    return [Member(row.id, row.started, row.last_seen) for row in BrokerMember.objects.all()]


def _member_delete(member: str) -> None:
    BrokerMember.objects.filter(pk=member).delete()


_current: Recovery | None = None


async def members_join(kind: str) -> Recovery:
    """Make this process (its running event loop's broker) a member; idempotent."""
    global _current
    if _current is None:
        _current = Recovery(broker_get(), kind)
        await _current.join()
    return _current


def look_ride(pipe: Any) -> Callable[[list[Any]], None] | None:
    """This process's heartbeat look, when due, in another's round trip (``Recovery.look_ride``)."""
    return _current.look_ride(pipe) if _current is not None else None


async def members_leave() -> None:
    global _current
    if _current is not None:
        await _current.leave()
        _current = None
