"""The broker on the simulated clock, as ``gateway.admission`` and ``quotas.queue`` drive it.

Admission (SPEC C3–C4, D2, E1, E6): each ranked candidate gets one fast try in its provider's
pool (``QueueBook.enter`` without waiting: granted, or refused); when every one refuses, the
request waits in the fair queue of the candidate that will fit first, until its workload's
deadline. The queue is the real one — ``quotas.core.queuebook.QueueBook`` over the in-memory
``Book`` — and so is the way a gateway process wakes it: one timer per pool at the pool's next
fit time (jittered), a pump with every reconcile and release, verdicts read from the process's
mailbox, and a waiter that leaves at its deadline unless the pump granted it first. Also here:
the provider pause after a 429 (F2) and the C12 header observation.

Grants the queue hands out later are dispatched through the event loop, never from inside the
call that produced them, so a chain of instant refusals cannot recurse.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quotas.core.book import reserve_amount
from quotas.core.fairqueue import (
    DEFAULT_BURST_TOKENS,
    Pumped,
    Queued,
    QueueReason,
    QueueRefusal,
    refusal_floor,
    request_cost,
    scarce_buckets,
)
from quotas.core.increments import DEFAULT_STEP_TOKENS
from quotas.core.jitter import jittered, pause_spread
from quotas.core.keys import record_key
from quotas.core.learned import asked_of, refusal_unexplained
from quotas.core.model import BucketSpec, Dimension, Grant, Reason, Rule, Usage
from quotas.core.queuebook import QueueBook
from quotas.queue import IDLE_PUMP_GAP, MAX_JITTER
from quotas.store.memory import MemoryReservationStore
from routing.core.capacity import CapacityView
from routing.core.router import Router
from simulator.model import LimitStatus
from simulator.switchback.loop import EventLoop
from simulator.switchback.traffic import SimRequest

if TYPE_CHECKING:
    from simulator.switchback.route import Route

# One lease per reservation, longer than any answer (the gateway renews instead).
LEASE_S = 900.0
MAILBOX = "sim"
FLOW = "sim/interactive"
# gateway.admission.FLOW_SHARE_OF_QUEUE: one flow may fill at most half of a pool's queue.
FLOW_SHARE_OF_QUEUE = 0.5
# C12 as quotas.broker does it: a provider's headers tighten our buckets only when it is nearly
# out (quotas.broker.OBSERVE_BELOW_SHARE; that module needs Django, this one must not).
OBSERVE_BELOW_SHARE = 0.25
OBSERVED_DIMENSIONS = {
    "requests": Dimension.REQUESTS,
    "input_tokens": Dimension.INPUT_TOKENS,
    "output_tokens": Dimension.OUTPUT_TOKENS,
}


@dataclass(frozen=True, slots=True)
class Workload:
    deadline_s: float
    retry_budget: int
    weight: float = 1.0
    max_queue_depth: int = 100
    # C10: how its streams reserve output ("max" or "increments", in steps of step_tokens).
    stream_reservation: str = "max"
    stream_step_tokens: int = DEFAULT_STEP_TOKENS


class SimAdmission:
    """Fast tries, the fair queue's waits, settles that pump, pauses and header observations."""

    def __init__(
        self,
        *,
        loop: EventLoop,
        store: MemoryReservationStore,
        workload: Workload,
        rng: random.Random,
        granted: Callable[[SimRequest, Route, Grant | None], None],
        refused: Callable[[SimRequest], None],
        broker_refused: Callable[[SimRequest, Route, QueueRefusal], None],
        capacity: CapacityView | None = None,
        router: Router | None = None,
    ) -> None:
        self.loop, self.store, self.workload, self.rng = loop, store, workload, rng
        # The router's view of where capacity is left, told what every fast try heard
        # (as gateway.admission tells the live router's).
        self.capacity = capacity
        # The router, told every fast try's grant or refusal for its shadow prices
        # (``routing.core.scarcity``), as gateway.admission tells the live router.
        self.router = router
        self.queue = QueueBook(store.book)
        self.granted, self.refused, self.broker_refused = granted, refused, broker_refused
        depth = workload.max_queue_depth
        self.flow_depth = max(1, math.ceil(depth * FLOW_SHARE_OF_QUEUE))
        self._serial = 0
        self._waiters: dict[str, tuple[SimRequest, Route]] = {}
        self._waiting: dict[str, int] = {}  # pool → waiters of this process
        self._timers: dict[str, tuple[float, int]] = {}  # pool → (when, token)
        self._token = 0
        self._leases: deque[tuple[float, str]] = deque()  # (forget after, record key)

    # -- admission ------------------------------------------------------------------------
    def admit(self, request: SimRequest) -> None:
        """Try the candidates in plan order; when none fits, wait in the best one's queue."""
        now = self.loop.now
        deadline = request.arrival + self.workload.deadline_s
        best: tuple[float, Route] | None = None
        for route in request.candidates:
            if not route.buckets:  # nothing limits this provider: nothing to reserve
                self.granted(request, route, None)
                return
            result = self._enter(request, route, deadline, wait=False, now=now)
            if isinstance(result, Grant):
                if self.capacity is not None:
                    self.capacity.room(route.endpoint.id)
                if self.router is not None:
                    self.router.scarcity_granted(route.endpoint.id, route.scope, now)
                self.granted(request, route, result)
                return
            assert isinstance(result, QueueRefusal)
            if self.capacity is not None:
                floor = refusal_floor(result, route.buckets, now)
                self.capacity.full(route.endpoint.id, floor, now, float(request.input_tokens))
            if self.router is not None:
                self._scarcity_heard(request, route, result, now)
            if result.reason is not QueueReason.DEADLINE:
                self.broker_refused(request, route, result)
            if result.reason is Reason.UNSATISFIABLE:
                continue
            if best is None or result.retry_at < best[0]:
                best = (result.retry_at, route)
        if best is None:
            self.refused(request)
            return
        route = best[1]
        waited = self._enter(request, route, deadline, wait=True, now=now)
        if isinstance(waited, Grant):
            self.granted(request, route, waited)
        elif isinstance(waited, QueueRefusal):
            self.refused(request)
        else:
            self._wait(request, route, waited, deadline)

    def _scarcity_heard(
        self, request: SimRequest, route: Route, refusal: QueueRefusal, now: float
    ) -> None:
        assert self.router is not None
        scarce = scarce_buckets(refusal, route.buckets)
        if scarce is not None:
            planned_in, planned_out = request.planned
            self.router.scarcity_refused(
                route.endpoint.id,
                route.scope,
                now,
                scarce,
                input_tokens=planned_in,
                output_tokens=planned_out,
            )

    def _enter(
        self, request: SimRequest, route: Route, deadline: float, *, wait: bool, now: float
    ) -> Grant | QueueRefusal | Queued:
        e = route.endpoint
        output = min(request.max_tokens, e.max_output)
        cost = None
        most = 0.0
        if request.step_plan is not None:
            # C10 in steps (gateway.admission.reserved_usage): the first step of output and
            # its spend, the whole output in the provider's buckets that count max_tokens;
            # its place in the fair queue is charged its whole estimate (_turn).
            cost = request_cost(Usage(input_tokens=request.input_tokens, output_tokens=output))
            most = float(output)
            output = request.step_plan.first_step(output)
        spend = (request.input_tokens * e.price_input + output * e.price_output) * 1e-6
        demand = Usage(1.0, float(request.input_tokens), float(output), spend, 1.0, output_max=most)
        self._serial += 1
        rid = str(self._serial)
        pool = route.scope
        paused = self.store.book.paused_until(pool, now)
        idle = pool not in self.queue.pools or not self.queue.pools[pool].entries
        shortcut = not wait and paused > now and idle and deadline > now
        if shortcut and not _unsatisfiable(route.buckets, demand):
            # What enter() would answer, without the work: an idle pool's paused buckets
            # refuse until the pause ends (Book.reserve reads and writes nothing then).
            return QueueRefusal(rid, now, Reason.PAUSED, route.buckets[0].name, paused)
        depth = self.workload.max_queue_depth if wait else 0
        result = self.queue.enter(
            rid,
            route.buckets,
            demand,
            pool=pool,
            flow=FLOW,
            weight=self.workload.weight,
            deadline=deadline,
            max_depth=depth,
            flow_depth=self.flow_depth if wait else 0,
            lease_seconds=LEASE_S,
            burst=DEFAULT_BURST_TOKENS,
            mailbox=MAILBOX,
            now=now,
            cost=cost,
        )
        self._deliver()  # entering pumps the pool: others may have been granted
        return result

    def _wait(self, request: SimRequest, route: Route, queued: Queued, deadline: float) -> None:
        rid, pool = queued.reservation_id, route.scope
        self._waiters[rid] = (request, route)
        self._waiting[pool] = self._waiting.get(pool, 0) + 1
        self._schedule(pool, queued.next_fit)
        self.loop.schedule(deadline, self._deadline, (rid, pool))

    def _deadline(self, args: tuple[str, str]) -> None:
        rid, pool = args
        waiter = self._forget_waiter(rid, pool)
        if waiter is None:
            return  # the pump decided first
        verdict = self.queue.leave(pool, rid, reason=QueueReason.DEADLINE, now=self.loop.now)
        self._decide(waiter, verdict)
        self._deliver()  # leaving the head of the line pumps the pool

    def _forget_waiter(self, rid: str, pool: str) -> tuple[SimRequest, Route] | None:
        waiter = self._waiters.pop(rid, None)
        if waiter is not None:
            self._waiting[pool] -= 1
            if not self._waiting[pool]:
                del self._waiting[pool]
        return waiter

    def _decide(self, waiter: tuple[SimRequest, Route], verdict: object) -> None:
        request, route = waiter
        if isinstance(verdict, Grant):
            self.loop.schedule(self.loop.now, self._grant_later, (request, route, verdict))
        else:
            self.refused(request)

    def _grant_later(self, args: tuple[SimRequest, Route, Grant]) -> None:
        self.granted(*args)

    # -- pumping (quotas.queue.BrokerQueue's wake-ups) -------------------------------------
    def _schedule(self, pool: str, next_fit: float) -> None:
        if math.isinf(next_fit) or pool not in self._waiting:
            return
        now = self.loop.now
        delay = max(0.0, next_fit - now)
        delay += self.rng.uniform(0.0, min(MAX_JITTER, 0.001 + 0.05 * delay))
        when = now + delay
        current = self._timers.get(pool)
        if current is not None and current[0] <= when:
            return
        self._token += 1
        self._timers[pool] = (when, self._token)
        self.loop.schedule(when, self._fire, (pool, self._token))

    def _fire(self, args: tuple[str, int]) -> None:
        pool, token = args
        current = self._timers.get(pool)
        if current is None or current[1] != token:
            return  # superseded by an earlier timer
        del self._timers[pool]
        if pool in self._waiting:
            self._after(pool, self.queue.pump(pool, now=self.loop.now))

    def _after(self, pool: str, pumped: Pumped | None) -> None:
        self._deliver()
        if pumped is None:
            return
        self._schedule(pool, pumped.next_pump_at(IDLE_PUMP_GAP))

    def _deliver(self) -> None:
        for rid, verdict in self.queue.take_mail(MAILBOX):
            waiter = self._waiters.get(rid)
            if waiter is None:
                if isinstance(verdict, Grant) and verdict.parts:  # nobody waits for it any more
                    pool = verdict.parts[0].bucket.scope
                    self.queue.settle(verdict, None, pool=pool, now=self.loop.now)
                continue
            self._forget_waiter(rid, waiter[1].scope)
            self._decide(waiter, verdict)

    # -- settling, pauses, headers --------------------------------------------------------
    def dispatched(self, grant: Grant | None, route: Route) -> None:
        """Remember a granted lease so its record can be dropped once settled and old."""
        if grant is not None:
            key = record_key(self.store.book.prefix, route.scope, grant.reservation_id)
            self._leases.append((self.loop.now + LEASE_S + 1.0, key))

    def settle(self, route: Route, grant: Grant | None, actual: Usage | None) -> None:
        """Reconcile (or release, ``actual`` None) and pump the pool (C6, quotas.queue)."""
        if grant is None:
            return
        now = self.loop.now
        _, pumped = self.queue.settle(grant, actual, pool=route.scope, now=now)
        self._after(route.scope, pumped)
        self._forget_closed_leases(now)

    def pause(self, route: Route, retry_after: float) -> None:
        """F2: Retry-After is a floor for the whole provider; jitter spreads the wake-ups."""
        now = self.loop.now
        until = jittered(now + retry_after, spread=pause_spread(retry_after), rng=self.rng)
        self.store.pause(route.scope, until, now=now)

    def observe_headers(self, route: Route, limits: LimitStatus) -> None:
        """C12: the provider's rate-limit headers tighten its refill buckets when nearly out.

        The headers describe the provider right after admitting the request; the simulated
        network is instantaneous, so they are applied at dispatch.
        """
        now = self.loop.now
        for status in limits.dimensions:
            dimension = OBSERVED_DIMENSIONS.get(status.dimension)
            if dimension is None or status.remaining > OBSERVE_BELOW_SHARE * status.limit:
                continue
            for spec in route.buckets:
                if spec.rule is Rule.REFILL and spec.dimension is dimension:
                    self.store.observe(
                        spec, remaining=status.remaining, reset_at=now + status.reset_s, now=now
                    )

    def observe_refusal(self, route: Route, request: SimRequest, limits: LimitStatus) -> None:
        """A provider 429 that no limit in its headers explains cuts the provider's learned
        concurrency limit (``quotas.core.learned``), as ``Broker.observe_refusal`` does.

        The behaviour model also reports its concurrency; no header carries that, so the
        gateway cannot see it and neither does this.
        """
        learned = [spec for spec in route.buckets if spec.learned]
        if not learned:
            return
        output = min(request.max_tokens, route.endpoint.max_output)
        demand = Usage(input_tokens=float(request.input_tokens), output_tokens=float(output))
        reported = [
            (status.remaining, asked_of(status.dimension, demand))
            for status in limits.dimensions
            if status.dimension != "concurrency"
        ]
        if refusal_unexplained(reported):
            now = self.loop.now
            for spec in learned:
                self.store.observe(spec, remaining=0.0, now=now)

    def _forget_closed_leases(self, now: float) -> None:
        # The in-memory book keeps settled lease records until they are read again after their
        # retention; a week of requests would fill memory. Drop closed ones once past it.
        leases, records = self._leases, self.store.book._records
        while leases and leases[0][0] <= now:
            _, key = leases.popleft()
            record = records.get(key)
            if record is not None and record.state != "active":
                del records[key]


def _unsatisfiable(buckets: tuple[BucketSpec, ...], demand: Usage) -> bool:
    return any(b.rule is not Rule.RAMP and reserve_amount(b, demand) > b.capacity for b in buckets)
