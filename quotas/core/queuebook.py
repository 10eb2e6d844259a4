"""The fair queue's in-memory twin over the reservation ``Book`` (pure; ``now`` is a parameter).

It is the reference for ``quotas/store/lua/queue_*.lua`` — the same steps in the same order —
and what a discrete-event simulation drives. Verdicts for waiters go to mailboxes (one per
gateway process in production); the caller of ``enter`` gets its own verdict directly.
With ``alive_seconds`` (as on Redis), a mailbox is alive until ``alive_seconds`` after its
last mark (a waiter joining, ``keep_alive``), and the pump drops the waiters of a dead one.
A pool's queue as data (waiters, flows, tags, verdicts) is ``queuepool``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Sequence

from quotas.core.book import Book, demand_parts
from quotas.core.fairqueue import (
    DRAIN_MARGIN,
    DRAIN_SCAN,
    EARLY_LIMIT,
    MAX_GRANTS,
    MAX_VISITS,
    SWEEP_LIMIT,
    UNPARK_LIMIT,
    Pumped,
    Queued,
    QueueReason,
    QueueRefusal,
    Side,
    Verdict,
    bucket_sides,
    drain_floor,
    earliest_admission,
    finish_tag,
    lane_key,
    lane_of,
    request_cost,
    start_tag,
    unreachable,
)
from quotas.core.keys import record_key
from quotas.core.model import (
    INF,
    BucketSpec,
    Grant,
    Reason,
    ReconcileResult,
    Refusal,
    Rule,
    Usage,
)
from quotas.core.queuepool import (
    Entry,
    Flow,
    PoolQueue,
    longest_flow,
    newest_waiter,
    next_due,
    verdicts_prune,
)

# How long a verdict stays readable by ``leave`` after the pump decided it, beyond the lease.
VERDICT_SECONDS = 60.0
# Bucket tuples whose sides a queue book remembers at most (more: it starts over).
SIDES_KEPT = 4096
# Mailboxes' alive marks are pruned of expired ones once they are more than this many.
ALIVE_KEPT = 1024
# (pool, id of a bucket tuple) → (that tuple, its sides, its lane): see ``QueueBook._sides``.
SidesKept = dict[tuple[str, int], tuple[tuple[BucketSpec, ...], tuple[Side, ...], str]]


class QueueBook:
    """Fair queues of all pools over one ``Book``, driven with an explicit ``now``.

    ``alive_seconds``: drop the waiters of mailboxes not marked alive for that long, as the
    Redis queue always does (``MAILBOX_ALIVE_SECONDS``); None (a simulation whose one
    mailbox is always read): every mailbox is alive."""

    def __init__(self, book: Book, *, alive_seconds: float | None = None) -> None:
        self.book = book
        self.pools: dict[str, PoolQueue] = {}
        self.mailboxes: dict[str, list[tuple[str, Verdict]]] = {}
        self.alive_seconds = alive_seconds
        self.alive: dict[str, float] = {}  # mailbox → alive until
        self._alive_prune_at = ALIVE_KEPT
        self._sides_kept: SidesKept = {}

    def _pool(self, pool: str) -> PoolQueue:
        pq = self.pools.get(pool)
        if pq is None:  # not setdefault: that would build a PoolQueue on every call
            pq = self.pools[pool] = PoolQueue()
        return pq

    def _sides(self, buckets: Sequence[BucketSpec], pool: str) -> tuple[tuple[Side, ...], str]:
        """``bucket_sides`` and ``lane_of``, remembered per bucket tuple: a route's tuple comes
        with every request, and working the sides out again for each was a noticeable cost."""
        if not isinstance(buckets, tuple):  # a list may change: nothing to remember it by
            sides = bucket_sides(buckets, pool)
            return sides, lane_of(buckets, sides)
        key = (pool, id(buckets))
        kept = self._sides_kept.get(key)
        if kept is None or kept[0] is not buckets:  # held, so its id is not reused meanwhile
            sides = bucket_sides(buckets, pool)
            kept = (buckets, sides, lane_of(buckets, sides))
            if len(self._sides_kept) >= SIDES_KEPT:
                self._sides_kept.clear()
            self._sides_kept[key] = kept
        return kept[1], kept[2]

    def take_mail(self, mailbox: str) -> list[tuple[str, Verdict]]:
        """The verdicts the pump pushed for ``mailbox``'s waiters, oldest first."""
        return self.mailboxes.pop(mailbox, [])

    def keep_alive(self, mailbox: str, *, now: float) -> None:
        """Mark ``mailbox`` alive until ``alive_seconds`` after ``now`` (its listener reads it)."""
        if self.alive_seconds is None:
            return
        self.alive[mailbox] = now + self.alive_seconds
        if len(self.alive) > self._alive_prune_at:  # expired marks mean what no mark means
            self.alive = {m: until for m, until in self.alive.items() if until > now}
            self._alive_prune_at = max(ALIVE_KEPT, 2 * len(self.alive))

    def is_alive(self, mailbox: str, now: float) -> bool:
        """Is someone still reading ``mailbox`` (its mark is after ``now``)?"""
        if self.alive_seconds is None:
            return True
        return self.alive.get(mailbox, -INF) > now

    # -- entering -------------------------------------------------------------------------
    def enter(
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
        mailbox: str,
        now: float,
        cost: float | None = None,
    ) -> Grant | QueueRefusal | Queued:
        """Grant at once when nobody waits and it fits; otherwise join the queue and pump.
        ``cost``: the virtual-time cost, when not ``request_cost(demand)``."""
        parts = demand_parts(buckets, demand)
        rec = self.book._record(record_key(self.book.prefix, buckets[0].scope, reservation_id), now)
        if rec is not None:
            return self.book._replay(rec, now)
        pq = self._pool(pool)
        if reservation_id in pq.entries:
            return Queued(reservation_id, now, reservation_id, pq.next_fit)
        for spec, amount in parts:
            if not spec.shadow and spec.rule is not Rule.RAMP and amount > spec.capacity:
                return QueueRefusal(reservation_id, now, Reason.UNSATISFIABLE, spec.name, INF)
        if deadline <= now:
            return QueueRefusal(reservation_id, now, QueueReason.DEADLINE, "", now, reservation_id)
        sides, lane = self._sides(buckets, pool)
        entry = Entry(
            reservation_id,
            flow,
            tuple(buckets),
            demand,
            sides,
            float(weight),
            request_cost(demand) if cost is None else float(cost),
            float(burst),
            float(deadline),
            float(lease_seconds),
            mailbox,
            parts,
            lane,
        )
        no_wait = max_depth <= 0 or flow_depth <= 0
        if not pq.entries:
            result = self.book.reserve_parts(
                reservation_id, parts, now=now, lease_seconds=lease_seconds
            )
            if isinstance(result, Grant):
                self._account(pq, entry, self._start(pq, entry))
                return result
            late = unreachable(result, entry.rules(), entry.deadline, now)
            if late is not None:
                return late
            if no_wait:
                return QueueRefusal(
                    reservation_id,
                    now,
                    result.reason,
                    result.bucket,
                    result.retry_at,
                    "",
                    result.refusals,
                )
            self._join(pq, entry, now)
            pq.next_fit = result.retry_at
            return Queued(reservation_id, now, reservation_id, result.retry_at)
        if not no_wait:
            waiting = len(pq.flows.get(flow, ()))
            if waiting >= flow_depth:
                hint = pq.retry_hint(now)
                return QueueRefusal(
                    reservation_id, now, QueueReason.FLOW_FULL, "", hint, reservation_id
                )
            if len(pq.entries) >= max_depth:
                longest, size = longest_flow(pq)
                if size <= waiting + 1:
                    hint = pq.retry_hint(now)
                    return QueueRefusal(
                        reservation_id, now, QueueReason.QUEUE_FULL, "", hint, reservation_id
                    )
                victim = newest_waiter(pq.flows[longest])
                self._drop(pq, victim, self._refuse(pq, victim, QueueReason.QUEUE_FULL, now), now)
        self._join(pq, entry, now)
        pumped, mine = self._pump(pq, now, reservation_id)
        if mine is not None:
            self._forget(pq, reservation_id)
            return mine
        refusal = (
            self._refuse(pq, entry, QueueReason.QUEUE_FULL, now)
            if no_wait
            else self._drain_refusal(pq, entry, now)
        )
        if refusal is not None:
            self._drop(pq, entry, refusal, now, notify=False)
            self._forget(pq, reservation_id)
            return refusal
        return Queued(reservation_id, now, reservation_id, pumped.next_fit)

    def _drain_refusal(self, pq: PoolQueue, entry: Entry, now: float) -> QueueRefusal | None:
        """E6: refuse a newcomer now when the waiters ahead of it in its own lane will use up
        the pool's refill before its deadline (``drain_floor``), instead of at the deadline.
        (Those in the flow's other lanes may go before or after it: they are not counted.)"""
        specs, own = entry.drained()
        lane = pq.flows[entry.flow].lanes[entry.lane]
        if not specs or len(lane) < 2:
            return None

        def amounts(waiter: Entry) -> list[float]:
            theirs, asked = waiter.drained()
            if theirs == specs:  # the same route: the same buckets (compared by identity first)
                return asked
            taken = dict(zip((spec.name for spec in theirs), asked, strict=True))
            return [taken.get(spec.name, 0.0) for spec in specs]

        # The newcomer is its lane's last; at most DRAIN_SCAN of those before it are read.
        scan = min(len(lane) - 1, DRAIN_SCAN)
        ahead = [(w.deadline, amounts(w)) for w in itertools.islice(lane, scan)]
        levels = self.book.refill_levels(specs, now=now)
        floor, which = drain_floor(ahead, own, levels, now)
        if floor <= entry.deadline - DRAIN_MARGIN:  # as a waiter ahead is judged
            return None
        rid = entry.reservation_id
        reason = QueueReason.DEADLINE_UNREACHABLE
        return QueueRefusal(rid, now, reason, specs[which].name, floor, rid)

    # -- the pump -------------------------------------------------------------------------
    def pump(self, pool: str, *, now: float) -> Pumped:
        """Hand out what fits, in start-tag order (see ``_pump``)."""
        pq = self._pool(pool)
        if not pq.entries:
            return Pumped(now, INF, 0, 0, 0)
        return self._pump(pq, now, None)[0]

    def _pump(
        self, pq: PoolQueue, now: float, newcomer: str | None
    ) -> tuple[Pumped, Verdict | None]:
        mine: Verdict | None = None
        refused = 0
        # Every waiter's deadline is in the heap (among stale ones): if its top is not due,
        # nobody is, and the sweep can be skipped.
        if pq.deadlines and pq.deadlines[0][0] <= now:
            for _ in range(SWEEP_LIMIT):
                due = next_due(pq, now)
                if due is None:
                    break
                self._drop(pq, due, self._refuse(pq, due, QueueReason.DEADLINE, now), now)
                refused += 1
        self._unpark(pq, now)
        blocked: set[tuple[str, str]] = set()
        skipped: set[str] = set()  # flows whose head was passed over this call
        offset = visits = granted = 0
        next_fit, stopped_at, exhausted = INF, -1.0, False
        while visits < MAX_VISITS and granted < MAX_GRANTS:
            if offset >= len(pq.heads):
                exhausted = True
                break
            s, rid = pq.heads[offset]
            visits += 1
            entry = pq.entries[rid]
            if entry.deadline <= now:
                verdict: Verdict = self._refuse(pq, entry, QueueReason.DEADLINE, now)
                self._drop(pq, entry, verdict, now, notify=rid != newcomer)
                refused += 1
                mine = verdict if rid == newcomer else mine
                continue
            if not self.is_alive(entry.mailbox, now):
                # Its process stopped reading (crashed): a grant would hold capacity nobody
                # uses until the lease expires. It leaves, taking nothing; its flow moves on.
                verdict = QueueRefusal(rid, now, QueueReason.ABANDONED, "", now, rid)
                self._drop(pq, entry, verdict, now, notify=rid != newcomer)
                refused += 1
                mine = verdict if rid == newcomer else mine
                continue
            if blocked and any((b.scope, b.name) in blocked for b in entry.buckets):
                skipped.add(entry.flow)
                offset += 1
                continue
            result = self.book.reserve_parts(rid, entry.parts, now=now, lease_seconds=entry.lease)
            if isinstance(result, Grant):
                self._grant(pq, entry, s, result, now, notify=rid != newcomer)
                granted += 1
                mine = result if rid == newcomer else mine
                continue
            late = unreachable(result, entry.rules(), entry.deadline, now)
            if late is not None:
                self._drop(pq, entry, late, now, notify=rid != newcomer)
                refused += 1
                mine = late if rid == newcomer else mine
                continue
            names = {r.bucket for r in result.refusals}
            sides = {
                side for b, side in zip(entry.buckets, entry.sides, strict=True) if b.name in names
            }
            next_fit = min(next_fit, result.retry_at)
            if Side.POOL in sides:
                stopped_at = self._floor(entry, result, now, pool_only=True)
                break
            if sides == {Side.OWN} and self._floor(entry, result, now) == result.retry_at:
                # Held by its own limit until a known time: its lane is not backlogged till
                # then (parked), and the next lane of its flow puts its first waiter up.
                pq.parked[lane_key(entry.flow, entry.lane)] = result.retry_at
                pq.heads.pop(offset)
                del pq.head_of[rid]
                flow = pq.flows[entry.flow]
                flow.ring.popleft()  # the head's lane is the ring's first
                if flow.ring:
                    self._set_head(pq, flow.lanes[flow.ring[0]][0])
                # Its new head may have a tag among those already passed, and not be tried
                # in this call: the flow is not told it is doomed behind a later head.
                skipped.add(entry.flow)
                continue
            blocked.update((b.scope, b.name) for b in entry.buckets if b.name in names)
            skipped.add(entry.flow)
            offset += 1
        if stopped_at < 0 and not exhausted:
            next_fit = now  # bounded work per call: more may fit right away
        if pq.parked:
            next_fit = min(next_fit, min(pq.parked.values()))
        if stopped_at > now:
            told, doomed = self._refuse_doomed(pq, stopped_at, skipped, now, newcomer)
            refused += told
            mine = doomed or mine
        if not pq.entries:
            next_fit = INF
        pq.next_fit = next_fit
        return Pumped(now, next_fit, len(pq.entries), granted, refused), mine

    def _refuse_doomed(
        self, pq: PoolQueue, floor: float, skipped: set[str], now: float, newcomer: str | None
    ) -> tuple[int, Verdict | None]:
        """The pool cannot fit the line's head before ``floor``, and nobody behind the head can
        pass it: tell those whose deadline comes first now. Flows passed over (or with a lane
        parked) in this call, and lanes parked for their own limits, are ahead of the head and
        might still fit sooner: they keep waiting."""
        if not pq.deadlines or pq.deadlines[0][0] >= floor:
            return 0, None  # every waiter's deadline is in the heap: none comes before floor
        doomed = sorted((e.deadline, rid) for rid, e in pq.entries.items() if e.deadline < floor)
        told, mine = 0, None
        for _, rid in doomed[:EARLY_LIMIT]:
            entry = pq.entries[rid]
            if entry.flow in skipped or lane_key(entry.flow, entry.lane) in pq.parked:
                continue
            refusal = QueueRefusal(rid, now, QueueReason.DEADLINE_UNREACHABLE, "", floor, rid)
            self._drop(pq, entry, refusal, now, notify=rid != newcomer)
            mine = refusal if rid == newcomer else mine
            told += 1
        return told, mine

    # -- leaving --------------------------------------------------------------------------
    def leave(
        self, pool: str, reservation_id: str, *, reason: QueueReason, now: float
    ) -> Verdict | None:
        """A waiter leaves (deadline, cancellation) — unless the pump decided first: then that
        verdict (a grant it now owns, or a refusal). None: the queue never heard of it."""
        pq = self._pool(pool)
        entry = pq.entries.get(reservation_id)
        if entry is None:
            kept = pq.verdicts.pop(reservation_id, None)
            return None if kept is None or kept[1] <= now else kept[0]
        retry_at = now if reason is QueueReason.CANCELLED else pq.retry_hint(now)
        refusal = QueueRefusal(reservation_id, now, reason, "", retry_at, reservation_id)
        was_head = reservation_id in pq.head_of
        self._drop(pq, entry, refusal, now, notify=False)
        self._forget(pq, reservation_id)
        if was_head and pq.entries:
            self._pump(pq, now, None)  # it may have held the line: let the others go
        return refusal

    def settle(
        self, grant: Grant, actual: Usage | None, *, pool: str | None, now: float
    ) -> tuple[ReconcileResult, Pumped | None]:
        """Reconcile (or release, ``actual=None``) and run the pool's pump in the same step."""
        result = self.book.settle(grant, actual, now=now)
        return result, None if pool is None else self.pump(pool, now=now)

    # -- steps ----------------------------------------------------------------------------
    @staticmethod
    def _start(pq: PoolQueue, entry: Entry) -> float:
        return start_tag(pq.v, pq.finish.get(entry.flow, -INF), entry.burst, entry.weight)

    @staticmethod
    def _account(pq: PoolQueue, entry: Entry, s: float) -> None:
        pq.finish[entry.flow] = finish_tag(s, entry.cost, entry.weight)
        pq.v = max(pq.v, s)

    def _join(self, pq: PoolQueue, entry: Entry, now: float) -> None:
        self.keep_alive(entry.mailbox, now=now)  # its process is alive: it is entering
        flow = pq.flows.get(entry.flow)
        if flow is None:
            flow = pq.flows[entry.flow] = Flow()
        lane = flow.lanes.get(entry.lane)
        if lane is None:
            lane = flow.lanes[entry.lane] = deque()
        lane.append(entry)
        flow.size += 1
        pq.entries[entry.reservation_id] = entry
        heapq.heappush(pq.deadlines, (entry.deadline, entry.reservation_id))
        if len(lane) == 1:
            # Parked for a request that is gone: start afresh, at the back of the ring.
            pq.parked.pop(lane_key(entry.flow, entry.lane), None)
            flow.ring.append(entry.lane)
            if len(flow.ring) == 1:
                self._set_head(pq, entry)

    def _unpark(self, pq: PoolQueue, now: float) -> None:
        """Lanes whose own limit fits again rejoin their flow's ring, at its back; a flow that
        had no head gets one, at most its burst credit behind V."""
        if not pq.parked:
            return
        due = sorted((until, key) for key, until in pq.parked.items() if until <= now)
        for _, key in due[:UNPARK_LIMIT]:
            del pq.parked[key]
            name, _, lane = key.rpartition("\x1f")
            flow = pq.flows.get(name)
            if flow is None or lane not in flow.lanes:
                continue  # its waiters are gone
            flow.ring.append(lane)
            if len(flow.ring) == 1:
                self._set_head(pq, flow.lanes[lane][0])

    def _set_head(self, pq: PoolQueue, entry: Entry) -> None:
        s = self._start(pq, entry)
        pq.head_of[entry.reservation_id] = s
        bisect.insort(pq.heads, (s, entry.reservation_id))

    def _grant(
        self, pq: PoolQueue, entry: Entry, s: float, grant: Grant, now: float, *, notify: bool
    ) -> None:
        self._account(pq, entry, s)
        self._drop(pq, entry, grant, now, notify=notify)

    def _drop(
        self, pq: PoolQueue, entry: Entry, verdict: Verdict, now: float, *, notify: bool = True
    ) -> None:
        """Take ``entry`` out of its lane (the head's lane goes to the back of the ring, and the
        ring's first lane puts up the next head), keep and send its verdict."""
        rid = entry.reservation_id
        flow = pq.flows[entry.flow]
        lane = flow.lanes[entry.lane]
        del pq.entries[rid]
        if rid in pq.head_of:
            s = pq.head_of.pop(rid)
            pq.heads.pop(bisect.bisect_left(pq.heads, (s, rid)))
            lane.popleft()
            flow.ring.popleft()  # the head's lane is the ring's first
            if lane:
                flow.ring.append(entry.lane)
            if flow.ring:
                self._set_head(pq, flow.lanes[flow.ring[0]][0])
        else:
            lane.remove(entry)
            if not lane and lane_key(entry.flow, entry.lane) not in pq.parked:
                flow.ring.remove(entry.lane)
        if not lane:
            del flow.lanes[entry.lane]
        flow.size -= 1
        if not flow.size:
            del pq.flows[entry.flow]
        pq.verdicts[rid] = (verdict, now + entry.lease + VERDICT_SECONDS)
        if notify:
            self.mailboxes.setdefault(entry.mailbox, []).append((rid, verdict))
        if len(pq.verdicts) > pq.verdicts_prune_at:
            verdicts_prune(pq, now)

    @staticmethod
    def _forget(pq: PoolQueue, rid: str) -> None:
        pq.verdicts.pop(rid, None)

    @staticmethod
    def _refuse(pq: PoolQueue, entry: Entry, reason: QueueReason, now: float) -> QueueRefusal:
        rid = entry.reservation_id
        return QueueRefusal(rid, now, reason, "", pq.retry_hint(now), rid)

    @staticmethod
    def _floor(entry: Entry, refusal: Refusal, now: float, *, pool_only: bool = False) -> float:
        return earliest_admission(refusal.refusals, entry.rules(pool_only=pool_only), now)
