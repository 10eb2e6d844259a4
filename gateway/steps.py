"""A stream's output reserved in steps as its tokens arrive (SPEC C10's second approach),
opt-in per workload class (``stream_reservation: increments``).

At admission such a stream reserves ``plan.first_step(max)`` of output instead of the whole
maximum (``admission.reserved_usage``). As chunks arrive the relay reports how many tokens the
stream has made so far (``StreamSteps.progress``); when ``plan.top_up`` says so, the next step
is asked of the broker in a task of its own — the stream never waits for it, and at most one
step is in flight per stream. A refused step does not cut the answer
(``quotas.core.increments``): the stream goes on, no further step is asked, and the settle
charges its real usage.

Before the stream settles, ``drain`` waits for a step still in flight, so the settle sees every
step that was granted and no task outlives the request. A step whose call reaches Redis after
the settle all the same (a connection cut mid-call) takes nothing: the lease is closed by then
(``extend.lua``), so no capacity is held until the lease would have run out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gateway import metrics
from quotas.broker import Broker
from quotas.core.increments import StepPlan
from quotas.core.model import Grant, Outcome, Usage

log = logging.getLogger(__name__)

# How long a stream's end waits for a step in flight (one Redis round trip) before it gives up
# on it; the step then takes nothing once the settle has closed the lease.
DRAIN_SECONDS = 2.0
OUTCOMES = {
    Outcome.EXTENDED: "granted",
    Outcome.REFUSED: "refused",
    Outcome.CLOSED: "closed",
    Outcome.EXPIRED: "closed",
    Outcome.UNKNOWN: "closed",
}


class GrantHolder(Protocol):
    """Whoever settles the stream: it reads the grant with every granted step in it."""

    grant: Grant


class StreamSteps:
    """One stream's reservation in steps: what it holds, and the one step it may be asking."""

    def __init__(
        self,
        plan: StepPlan,
        *,
        max_output: int,
        reserved: int,
        price_output: float,
        broker: Broker,
        holder: GrantHolder,
        drain_seconds: float = DRAIN_SECONDS,
    ) -> None:
        self.plan = plan
        self.max_output = max_output
        self.reserved = reserved  # output tokens the lease holds: the first step + granted steps
        self.price_output = price_output  # USD per million output tokens
        self.broker = broker
        self.holder = holder
        self.drain_seconds = drain_seconds
        self.refused = False  # a step was refused (or the lease is gone): none is asked again
        self.steps: list[str] = []  # each step's outcome, in order (for the ledger and tests)
        self._task: asyncio.Task[None] | None = None
        self._over = False

    def progress(self, generated: int) -> None:
        """The stream has made ``generated`` output tokens: ask for the next step if it is due
        and none is in flight (never blocks)."""
        if self._over or self.refused or (self._task is not None and not self._task.done()):
            return
        more = self.plan.top_up(self.reserved, generated, self.max_output)
        if more > 0:
            self._task = asyncio.create_task(self._extend(more))

    async def _extend(self, more: int) -> None:
        step = Usage(
            requests=0.0,
            output_tokens=float(more),
            spend=more * self.price_output / 1e6,
            concurrency=0.0,
        )
        try:
            result = await self.broker.extend(self.holder.grant, step)
        except Exception:  # Redis is failing: the stream goes on, on what it holds
            log.warning("a stream's next reservation step failed", exc_info=True)
            self._outcome("error")
            self.refused = True
            return
        if result.outcome is Outcome.EXTENDED and result.grant is not None:
            self.reserved += more
            self.holder.grant = result.grant
        else:
            self.refused = True
        self._outcome(OUTCOMES.get(result.outcome, "closed"))

    def _outcome(self, outcome: str) -> None:
        self.steps.append(outcome)
        metrics.child(metrics.STREAM_STEPS, outcome).inc()

    async def drain(self) -> None:
        """The stream is over: no step is asked any more, and one in flight is waited for (up
        to ``drain_seconds``, then cancelled), so that the settle comes after it."""
        self._over = True
        task = self._task
        if task is None or task.done():
            return
        await asyncio.wait([task], timeout=self.drain_seconds)
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
