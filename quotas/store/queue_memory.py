"""The fair queue's in-memory twin behind the same async interface as ``RedisQueueStore``.

Several of these may share one ``QueueBook`` (one per simulated gateway process, each with its
own mailbox); ``mail`` wakes when the pump leaves a verdict in this one's mailbox, and marks
the mailbox alive as the Redis store's listener does (when the ``QueueBook`` checks liveness).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence

from quotas.core.fairqueue import Pumped, Queued, QueueReason, QueueRefusal, Verdict
from quotas.core.model import BucketSpec, Grant, ReconcileResult, Usage
from quotas.core.queuebook import QueueBook
from quotas.store.base import LedgerCarry

# Mail bells of the stores sharing a QueueBook, so any step can wake the right listener.
_BELLS: weakref.WeakKeyDictionary[QueueBook, dict[str, asyncio.Event]] = weakref.WeakKeyDictionary()


class MemoryQueueStore:
    """``QueueBook`` with a clock and a mailbox; same methods as ``RedisQueueStore``."""

    def __init__(
        self, queue: QueueBook, *, clock: Callable[[], float], mailbox: str = "local"
    ) -> None:
        self.queue = queue
        self._clock = clock
        self.mailbox = mailbox
        self._bells = _BELLS.setdefault(queue, {})

    def clock(self) -> float:
        return self._clock()

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _ring(self) -> None:
        for mailbox, bell in self._bells.items():
            if self.queue.mailboxes.get(mailbox):
                bell.set()

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
        result = self.queue.enter(
            reservation_id,
            buckets,
            demand,
            pool=pool,
            flow=flow,
            weight=weight,
            deadline=deadline,
            max_depth=max_depth,
            flow_depth=flow_depth,
            lease_seconds=lease_seconds,
            burst=burst,
            mailbox=self.mailbox,
            now=self._now(now),
            cost=cost,
        )
        self._ring()
        return result

    async def pump(self, pool: str, *, now: float | None = None) -> Pumped:
        pumped = self.queue.pump(pool, now=self._now(now))
        self._ring()
        return pumped

    async def leave(
        self, pool: str, reservation_id: str, *, reason: QueueReason, now: float | None = None
    ) -> Verdict | None:
        verdict = self.queue.leave(pool, reservation_id, reason=reason, now=self._now(now))
        self._ring()
        return verdict

    async def settle(
        self,
        grant: Grant,
        actual: Usage | None,
        *,
        pool: str | None,
        now: float | None = None,
        carry: LedgerCarry | None = None,
    ) -> tuple[ReconcileResult, Pumped | None]:
        # No ledger here: a carry is left to its caller (its ``born`` stays None).
        result = self.queue.settle(grant, actual, pool=pool, now=self._now(now))
        self._ring()
        return result

    async def keep_alive(self, *, now: float | None = None) -> None:
        """Mark this mailbox alive (its listener reads it)."""
        self.queue.keep_alive(self.mailbox, now=self._now(now))

    async def mail(self, *, timeout: float, now: float | None = None) -> list[tuple[str, Verdict]]:
        """Verdicts for this mailbox's waiters (waits up to ``timeout`` s); marks it alive."""
        self.queue.keep_alive(self.mailbox, now=self._now(now))
        bell = self._bells.setdefault(self.mailbox, asyncio.Event())
        if not self.queue.mailboxes.get(self.mailbox) and timeout > 0:
            bell.clear()
            try:
                await asyncio.wait_for(bell.wait(), timeout)
            except TimeoutError:
                return []
        bell.clear()
        return self.queue.take_mail(self.mailbox)

    def forget(self, reservation_id: str) -> None:
        """Nothing to drop: verdicts are objects already."""
