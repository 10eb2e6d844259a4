"""The broker's fair queue as the request pipeline calls it (SPEC D2, E1, E2, E4, E6).

``await broker_queue.admit(...)`` is one call per attempt and returns a ``Grant`` or a
``QueueRefusal``. When nobody waits for the pool and the request fits, it is one Redis round
trip. Otherwise the request waits in the pool's fair queue (shared by every gateway process)
until the pump grants it, its deadline passes, or its client goes away.

Wake-ups, per gateway process:
- one listener task reads the process's mailbox (one ``BLPOP`` connection for all of its
  waiters) and resolves each waiter's future;
- one timer per pool with local waiters runs the pump at the pool's next fit time (refill,
  lease expiry, pause end; jittered), so refill-driven capacity is handed out with no central
  timer, and N processes cost N pump calls per wake-up, not one per waiter;
- every reconcile and release through this object pumps the pool in the same round trip, so
  capacity given back (a concurrency slot) goes to the next waiter at once;
- each waiter has its own deadline timer; at the deadline it leaves atomically, and if the pump
  granted it in the same instant it gets (and owns) that grant.

Crashes: a process that dies (SIGKILL, OOM) cannot leave. Every listener cycle marks its
mailbox alive for ``MAILBOX_ALIVE_SECONDS`` (in the ``BLPOP``'s round trip); the pump drops
the waiters of a mailbox whose mark has run out (``abandoned``) instead of granting them, so
their place goes to live waiters at once, not after a lease. Graceful shutdown cancels them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections import OrderedDict
from collections.abc import Coroutine, Sequence
from typing import Any

from common.faultlog import faults
from quotas.core.fairqueue import (
    DEFAULT_BURST_TOKENS,
    MAILBOX_ALIVE_SECONDS,
    Pumped,
    Queued,
    QueueReason,
    QueueRefusal,
    Verdict,
)
from quotas.core.model import BucketSpec, Grant, ReconcileResult, Usage
from quotas.store.base import LedgerCarry, QueueStore

log = logging.getLogger(__name__)

MAIL_TIMEOUT = 1.0  # the listener's BLPOP timeout (it stops when no waiter is left)
# Each cycle marks the mailbox alive: a live listener must come round well within the mark.
assert MAIL_TIMEOUT * 4 <= MAILBOX_ALIVE_SECONDS
IDLE_PUMP_GAP = 0.005  # a pump that could do nothing and names no later time: try again after
MAX_JITTER = 0.25  # seconds added at most to a pool's wake-up (F2: processes do not wake together)
REMEMBERED_GRANTS = 65536  # reservation id → pool, for reconcile/release without a pool


class BrokerQueue:
    """Fair admission to shared pools for one gateway process (one event loop)."""

    def __init__(
        self,
        store: QueueStore,
        *,
        lease_seconds: float = 30.0,
        burst_tokens: float = DEFAULT_BURST_TOKENS,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.burst_tokens = burst_tokens
        self._rng = rng or random.Random()
        self._waiters: dict[str, asyncio.Future[Verdict]] = {}
        self._waiting: dict[str, int] = {}  # pool → this process's queued waiters
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._listener: asyncio.Task[None] | None = None
        self._pools: OrderedDict[str, str] = OrderedDict()

    # -- the gateway's calls ---------------------------------------------------------------
    async def admit(
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
        lease_seconds: float | None = None,
        burst: float | None = None,
        cost: float | None = None,
    ) -> Grant | QueueRefusal:
        """Reserve in all ``buckets`` in fair turn among the pool's tenants, by ``deadline``
        (``cost``: its virtual-time cost, when not that of ``demand``)."""
        if not weight > 0:
            raise ValueError("a flow's weight must be positive")
        now = self.store.clock()
        if deadline <= now:
            return QueueRefusal(reservation_id, now, QueueReason.DEADLINE, "", now)
        lease = self.lease_seconds if lease_seconds is None else lease_seconds
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._waiters[reservation_id] = future  # before entering: the verdict may come first
        entering = asyncio.ensure_future(
            self.store.enter(
                reservation_id,
                buckets,
                demand,
                pool=pool,
                flow=flow,
                weight=weight,
                deadline=deadline,
                max_depth=max_depth,
                flow_depth=flow_depth,
                lease_seconds=lease,
                burst=self.burst_tokens if burst is None else burst,
                cost=cost,
            )
        )
        cleanup: asyncio.Task[None] | None = None  # it forgets the waiter when done
        try:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                # cancellation that arrives as the result does (the client's disconnect).
                async with asyncio.timeout(self._left(deadline)):
                    result = await asyncio.shield(entering)
            except TimeoutError:
                # Too slow even to enter (an overloaded process or Redis): answer at the
                # deadline; whatever the late call did is undone when it returns.
                cleanup = self._background(self._undo_entering(pool, reservation_id, entering))
                now = self.store.clock()
                return QueueRefusal(
                    reservation_id, now, QueueReason.DEADLINE, "", now, reservation_id
                )
            except asyncio.CancelledError:
                cleanup = self._background(self._undo_entering(pool, reservation_id, entering))
                await asyncio.shield(cleanup)
                raise
            if isinstance(result, Queued):
                try:
                    result = await self._wait(pool, reservation_id, deadline, result, future)
                except asyncio.CancelledError:
                    # The client went away: leave; a grant that raced in goes back.
                    cleanup = self._background(self._cancel(pool, reservation_id, future))
                    await asyncio.shield(cleanup)
                    raise
            if isinstance(result, Grant):
                self._remember(reservation_id, pool)
            return result
        finally:
            self._waiters.pop(reservation_id, None)
            if cleanup is None:
                self.store.forget(reservation_id)

    async def reconcile(
        self,
        grant: Grant,
        actual: Usage,
        *,
        pool: str | None = None,
        carry: LedgerCarry | None = None,
    ) -> ReconcileResult:
        """Reconcile with actual usage; the pool's next waiters get what came back. ``carry``:
        a ledger append for the same round trip (``QueueStore.settle``)."""
        return await self._settle(grant, actual, pool, carry)

    async def release(self, grant: Grant, *, pool: str | None = None) -> ReconcileResult:
        """Give the whole grant back (never dispatched); the pool's next waiters get it."""
        return await self._settle(grant, None, pool)

    async def pump(self, pool: str) -> Pumped:
        """Run the pool's pump now (e.g. after a pause was lifted or a limit raised)."""
        pumped = await self.store.pump(pool)
        self._after(pool, pumped)
        return pumped

    async def close(self) -> None:
        """Stop the pool timers and the listener; let clean-ups (leave, release) finish."""
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        tasks = [*self._tasks, *([self._listener] if self._listener else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- waiting ---------------------------------------------------------------------------
    def _left(self, deadline: float) -> float | None:
        return None if math.isinf(deadline) else max(0.0, deadline - self.store.clock())

    async def _wait(
        self,
        pool: str,
        rid: str,
        deadline: float,
        queued: Queued,
        future: asyncio.Future[Verdict],
    ) -> Verdict:
        self._waiting[pool] = self._waiting.get(pool, 0) + 1
        try:
            self._listen()
            self._schedule(pool, queued.next_fit)
            try:
                async with asyncio.timeout(self._left(deadline)):
                    return await asyncio.shield(future)
            except TimeoutError:
                verdict = await self.store.leave(pool, rid, reason=QueueReason.DEADLINE)
                if verdict is None:  # the queue lost it (e.g. Redis lost its state)
                    now = self.store.clock()
                    return QueueRefusal(rid, now, QueueReason.DEADLINE, "", now, rid)
                return verdict
        finally:
            self._waiting[pool] -= 1
            if not self._waiting[pool]:
                del self._waiting[pool]

    def _background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _cancel(self, pool: str, rid: str, future: asyncio.Future[Verdict]) -> None:
        try:
            verdict = await self.store.leave(pool, rid, reason=QueueReason.CANCELLED)
            if verdict is None and future.done():
                verdict = future.result()
            await self._undo(pool, verdict)
        except Exception:
            log.exception("fair queue: leaving for a cancelled waiter failed")
        finally:
            self.store.forget(rid)

    async def _undo_entering(
        self, pool: str, rid: str, entering: asyncio.Future[Grant | QueueRefusal | Queued]
    ) -> None:
        """Undo an admission its caller no longer waits for: leave, give a grant back."""
        try:
            result = await entering
            if isinstance(result, Queued):
                verdict = await self.store.leave(pool, rid, reason=QueueReason.CANCELLED)
                await self._undo(pool, verdict)
            else:
                await self._undo(pool, result)
        except Exception:
            log.exception("fair queue: undoing an abandoned admission failed")
        finally:
            self.store.forget(rid)

    async def _undo(self, pool: str, result: Verdict | None) -> None:
        if isinstance(result, Grant) and not result.replayed:
            await self._settle(result, None, pool)

    def _listen(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listening())

    async def _listening(self) -> None:
        while self._waiting:
            try:
                delivered = await self.store.mail(timeout=MAIL_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away for a moment: waiters still have their deadlines
                faults.warning(log, "queue:mail", "fair queue: reading the mailbox failed")
                await asyncio.sleep(0.05)
                continue
            for rid, verdict in delivered:
                future = self._waiters.get(rid)
                if future is not None and not future.done():
                    future.set_result(verdict)

    # -- pumping ---------------------------------------------------------------------------
    def _schedule(self, pool: str, next_fit: float) -> None:
        """Run the pool's pump at ``next_fit`` (jittered) unless an earlier run is due."""
        if math.isinf(next_fit) or pool not in self._waiting:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, next_fit - self.store.clock())
        delay += self._rng.uniform(0.0, min(MAX_JITTER, 0.001 + 0.05 * delay))
        when = loop.time() + delay
        current = self._timers.get(pool)
        if current is not None:
            if current[0] <= when:
                return
            current[1].cancel()
        self._timers[pool] = (when, loop.call_at(when, self._fire, pool))

    def _fire(self, pool: str) -> None:
        self._timers.pop(pool, None)
        if pool in self._waiting:
            self._background(self._pump_for(pool))

    async def _pump_for(self, pool: str) -> None:
        try:
            pumped = await self.store.pump(pool)
        except Exception:
            faults.warning(log, "queue:pump", "fair queue: pump of %s failed", pool)
            self._schedule(pool, self.store.clock() + 0.05)
            return
        self._after(pool, pumped)

    def _after(self, pool: str, pumped: Pumped | None) -> None:
        if pumped is None:
            return
        self._schedule(pool, pumped.next_pump_at(IDLE_PUMP_GAP))

    # -- settling --------------------------------------------------------------------------
    def _remember(self, rid: str, pool: str) -> None:
        self._pools[rid] = pool
        if len(self._pools) > REMEMBERED_GRANTS:
            self._pools.popitem(last=False)

    async def _settle(
        self,
        grant: Grant,
        actual: Usage | None,
        pool: str | None,
        carry: LedgerCarry | None = None,
    ) -> ReconcileResult:
        remembered = self._pools.pop(grant.reservation_id, None)
        pool = pool or remembered
        result, pumped = await self.store.settle(grant, actual, pool=pool, carry=carry)
        if pool is not None:
            self._after(pool, pumped)
        return result
