"""The broker's fair queue (SPEC D2, E1, E2, E4, E6): words, virtual-time tags and fairness math.

One queue per shared pool; inside it one flow per tenant (and workload class). The pump serves
flows in start-time fair queuing order (Goyal et al., SFQ): a flow's head carries the start tag

    S = max(finish[flow], V − burst / weight)

and when it is granted, ``finish[flow] = S + cost / weight`` and ``V = max(V, S)``. ``cost`` is
the request's estimated tokens (token-fair), ``weight`` = workload class × tenant weight.
Tags are computed lazily, when an entry becomes its flow's head (as Kubernetes APF does), so a
waiter that leaves early never inflates the tags of those behind it; ``burst / weight`` is how
far a returning (or own-limit-held) flow may lag V — its burst credit, in tokens.

Inside a flow, waiters wait in FIFO lanes, one per holder of their own limits (``lane_of``:
an app, a key): the flow's head is the first waiter of the first lane of its ring of lanes not
parked, and a lane goes to the back of the ring when its head is granted or leaves (round
robin among a tenant's apps). A lane whose head only its own limits hold is parked until they
fit, and the next lane's first waiter becomes the flow's head: one app held by its own limit
does not hold back the others of its tenant, and a flow still has one head, so a tenant with
many apps gets no more of the pool than a tenant with one.

The in-memory twin of the queue is ``quotas.core.queuebook.QueueBook``; the Redis one is
``quotas/store/lua/queue_*.lua``. Both follow the same steps with the same floats.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from quotas.core.model import (
    INF,
    BucketRefusal,
    BucketSpec,
    Dimension,
    Grant,
    Reason,
    Refusal,
    Rule,
    Usage,
)

# How much one pump call may do before it returns ``next_fit = now`` (call again): it runs
# inside one Redis script, so its work is bounded to keep Redis responsive.
MAX_VISITS = 32  # flow heads looked at
MAX_GRANTS = 16  # grants handed out
UNPARK_LIMIT = 64  # lanes parked on their own limit that rejoin per call
SWEEP_LIMIT = 16  # expired waiters dropped per call (their own process normally removes them)
EARLY_LIMIT = 16  # waiters told early that their deadline cannot be met
DRAIN_SCAN = 64  # waiters ahead in a newcomer's own lane counted by ``drain_floor``
# A waiter ahead counts as served if it fits this long before its deadline (a pump never
# grants at the deadline, and a fit time is one TICK late). Not the wake-up jitter (≤ 0.25 s):
# a waiter that misses its deadline by it holds back those behind it, whose deadlines come
# about as late, and a margin that wide would make a line of one class never look doomed when
# its pool refills faster than four requests a second.
DRAIN_MARGIN = 0.001

# Default per-flow burst credit, in tokens, when the caller gives none.
DEFAULT_BURST_TOKENS = 8192.0

# How long a gateway process's mailbox counts as alive after its last mark (set when one of
# its waiters joins a queue, and by its listener on every BLPOP cycle, at least once a
# second while it has waiters). The pump drops the waiters of a mailbox past its mark
# (``QueueReason.ABANDONED``) instead of granting capacity nobody will use: a crashed
# process's waiters stop taking capacity after at most this long. Five listener cycles: a
# live process whose event loop stalls for up to about four seconds keeps its waiters.
MAILBOX_ALIVE_SECONDS = 5.0


class QueueReason(StrEnum):
    """Why the queue refused (bucket reasons, e.g. ``unsatisfiable``, stay ``model.Reason``)."""

    DEADLINE = "deadline"  # the waiter's deadline came before its turn
    DEADLINE_UNREACHABLE = "deadline_unreachable"  # decided early: next fit is past the deadline
    QUEUE_FULL = "queue_full"  # the pool's queue is full (refused or evicted from the longest flow)
    FLOW_FULL = "flow_full"  # this tenant's own flow holds its maximum of waiters
    CANCELLED = "cancelled"  # the client went away while waiting
    ABANDONED = "abandoned"  # its gateway process stopped reading its mailbox (crashed, C9)


@dataclass(frozen=True, slots=True)
class QueueRefusal:
    """A refusal by the queue or by a bucket: nothing is held. Says nothing of other tenants (E4):
    a reason code, the refusing bucket's public name ('' when the queue refused), and when to
    retry. ``queue_id`` is set once the request had entered the queue (E6)."""

    reservation_id: str
    at: float
    reason: Reason | QueueReason
    bucket: str
    retry_at: float
    queue_id: str = ""
    refusals: tuple[BucketRefusal, ...] = ()  # the request's own buckets only
    granted: bool = field(default=False, init=False)


@dataclass(frozen=True, slots=True)
class Queued:
    """The request waits in the pool's queue; the pump will push its verdict to ``mailbox``."""

    reservation_id: str
    at: float
    queue_id: str
    next_fit: float  # when the pool may next fit its head (inf: on a release only)


@dataclass(frozen=True, slots=True)
class Pumped:
    """What one pump call did and when pumping again can help (``now``: at once; inf: only on a
    release or an arrival)."""

    at: float
    next_fit: float
    depth: int
    granted: int
    refused: int

    def next_pump_at(self, idle_gap: float) -> float:
        """When to pump again: ``next_fit``, but never at once after a pump that moved nothing
        (a pool whose next fit is already due yet grants nothing would make the pump spin)."""
        if self.next_fit <= self.at and not self.granted:
            return self.at + idle_gap
        return self.next_fit


Verdict = Grant | QueueRefusal


def request_cost(demand: Usage) -> float:
    """The virtual-time cost of a request: its estimated tokens (token-fair), at least one."""
    return max(1.0, float(demand.input_tokens + demand.output_tokens))


def start_tag(v: float, finish: float, burst: float, weight: float) -> float:
    """A head's start tag: its flow's last finish, but never more than its burst credit behind V."""
    return max(finish, v - burst / weight)


def finish_tag(start: float, cost: float, weight: float) -> float:
    return start + cost / weight


def earliest_admission(
    refusals: Sequence[BucketRefusal], rules: Mapping[str, Rule], now: float
) -> float:
    """A lower bound on when a refused request can be admitted: the latest fit time among the
    refusing buckets whose fit time is a floor (a concurrency slot may free sooner by a release;
    a ramp's ``inf`` only means "not in the next interval")."""
    floor = now
    for r in refusals:
        rule = rules.get(r.bucket)
        if rule is Rule.CONCURRENCY or rule is None:
            continue
        if rule is Rule.RAMP and math.isinf(r.retry_at):
            continue
        floor = max(floor, r.retry_at)
    return floor


def refusal_floor(refusal: QueueRefusal, buckets: Sequence[BucketSpec], now: float) -> float:
    """When a request refused on its fast try could fit at the earliest, as a floor the router
    may plan on (``routing.core.capacity``); ``now``: no floor is known.

    Only what a settle cannot hand back sooner is a floor: the fit time of the buckets of
    requests and input tokens (refill, or a daily or rolling window: the reservation is kept,
    as ``drain_floor`` counts), a ramp's, and a provider's pause. An output or spend
    reservation is mostly given back when the answer is shorter than its maximum, and a
    concurrency slot when any request ends: their fit times are no floor. Nor is the queue's
    hint when others wait ahead (their heads may wait on exactly those)."""
    if refusal.refusals:
        rules = {
            b.name: b.rule
            for b in buckets
            if b.rule is Rule.RAMP
            or (b.rule is not Rule.CONCURRENCY and b.dimension in DRAINED_DIMENSIONS)
        }
        floor = earliest_admission(refusal.refusals, rules, now)
        for r in refusal.refusals:
            if r.reason is Reason.PAUSED and r.retry_at < INF:
                floor = max(floor, r.retry_at)
        return floor
    if refusal.reason is Reason.PAUSED and now < refusal.retry_at < INF:
        return refusal.retry_at
    return now


# Refusals that say capacity is short (``scarce_buckets``); a pause, a lost state or a request
# larger than a bucket say nothing of how scarce it is.
SCARCE_REASONS = frozenset({Reason.BUCKET_EXHAUSTED, Reason.RAMP_LIMITED})
BUSY_REASONS = frozenset({QueueReason.QUEUE_FULL, QueueReason.FLOW_FULL})


def scarce_buckets(
    refusal: QueueRefusal, buckets: Sequence[BucketSpec]
) -> tuple[tuple[str, str], ...] | None:
    """What a refused fast try says of the pool's scarce buckets, as plain data for the router
    (``routing.core.scarcity``): the refusing ``buckets`` as (name, dimension); () when the
    pool refused because others wait in its queue (no bucket named); None when the refusal
    is no sign of scarcity (a pause, a lost state, a request larger than a bucket)."""
    if refusal.reason in BUSY_REASONS and not refusal.refusals:
        return ()
    dimensions = {b.name: b.dimension.value for b in buckets}
    named = [
        r.bucket for r in refusal.refusals if r.reason in SCARCE_REASONS and r.bucket in dimensions
    ]
    if not named and refusal.reason is QueueReason.DEADLINE_UNREACHABLE:
        # The waiters ahead drain this bucket past the deadline (E6): it is the scarce one.
        named = [refusal.bucket] if refusal.bucket in dimensions else []
    if not named:
        return None  # a pause, a lost state, too large, or the caller's own (tenant) limit
    return tuple((name, dimensions[name]) for name in named)


def unreachable(
    refusal: Refusal, rules: Mapping[str, Rule], deadline: float, now: float
) -> QueueRefusal | None:
    """What waiting cannot fix: a request larger than a bucket (``unsatisfiable``), a bucket
    whose state is being relearnt (``recovering``), or one whose next fit is past its deadline
    (``deadline_unreachable``). None: it may wait."""
    rid = refusal.reservation_id
    if refusal.reason is Reason.UNSATISFIABLE:
        return QueueRefusal(rid, now, refusal.reason, refusal.bucket, INF, "", refusal.refusals)
    for r in refusal.refusals:
        if r.reason is Reason.RECOVERING:
            # The state was lost (quotas.core.recovery): it is back within seconds while the
            # gateway processes live, and a queue's wait would only hide why.
            return QueueRefusal(rid, now, r.reason, r.bucket, r.retry_at, "", refusal.refusals)
    floor = earliest_admission(refusal.refusals, rules, now)
    if floor <= deadline:
        return None
    bucket = next((r.bucket for r in refusal.refusals if r.retry_at == floor), refusal.bucket)
    reason = QueueReason.DEADLINE_UNREACHABLE
    return QueueRefusal(rid, now, reason, bucket, refusal.retry_at, rid, refusal.refusals)


# What a request takes from these buckets it keeps: the drain of a queue in them can be foreseen.
# (An output or spend reservation is mostly given back when the answer is shorter than its
# maximum, so a queue drains those sooner than their refill alone says.)
DRAINED_DIMENSIONS = frozenset({Dimension.REQUESTS, Dimension.INPUT_TOKENS})


def drained(spec: BucketSpec) -> bool:
    """Does ``drain_floor`` count this bucket: a refill bucket of a kept dimension?"""
    return spec.rule is Rule.REFILL and spec.dimension in DRAINED_DIMENSIONS and not spec.shadow


def drain_floor(
    ahead: Sequence[tuple[float, Sequence[float]]],
    own: Sequence[float],
    levels: Sequence[tuple[float, float]],
    now: float,
) -> tuple[float, int]:
    """A lower bound on when a newcomer fits, given the waiters ahead of it in its own lane (E6).

    ``levels`` are the available amount and refill per second of the pool's drained buckets;
    ``ahead`` the deadline and amounts (in those buckets) of each waiter ahead, in order;
    ``own`` the newcomer's amounts. A lane is FIFO, so everyone ahead is served or leaves
    before the newcomer; one that cannot fit ``DRAIN_MARGIN`` before its own deadline may leave
    without taking anything, so it is not counted. Other lanes and flows only delay the
    newcomer, and these buckets keep what a request takes. Cancellations and failed attempts
    (released) are the exceptions, and rare. Returns (time, index of the binding bucket, or -1).
    """
    # Written out for speed (a newcomer reads up to DRAIN_SCAN waiters); the Lua twin compares
    # each waiter's latest fit time with its deadline, which gives the same answers.
    n = len(levels)
    available = [level for level, _ in levels]
    rates = [rate for _, rate in levels]
    used = [0.0] * n
    for deadline, amounts in ahead:
        limit = deadline - DRAIN_MARGIN
        fits = now <= limit
        i = 0
        while fits and i < n:
            short = used[i] + amounts[i] - available[i]
            fits = not (short > 0.0 and rates[i] > 0.0 and now + short / rates[i] > limit)
            i += 1
        if fits:
            for i in range(n):
                used[i] = used[i] + amounts[i]
    when, which = now, -1
    for i in range(n):
        short = used[i] + own[i] - available[i]
        if short > 0.0 and rates[i] > 0.0 and now + short / rates[i] > when:
            when, which = now + short / rates[i], i
    return when, which


class Side(IntEnum):
    """What a bucket's refusal of a flow's head means for the pump."""

    SHARED = 0  # shared with some other flows (partner, model route): heads with a later tag
    #             that need it wait this round, so a large request is not starved by small ones
    POOL = 1  # the pool's own: nobody fits before the head does, so the pump stops
    OWN = 2  # the flow's alone: its lane is parked (not backlogged) until the bucket fits


# Scope kinds (SPEC A1) whose buckets belong to one tenant's flow alone.
OWN_SCOPE_KINDS = frozenset({"api_key", "key", "app", "team", "tenant"})


def bucket_sides(buckets: Sequence[BucketSpec], pool: str) -> tuple[Side, ...]:
    """Each bucket's side: the pool's scope, one of a tenant's own scopes, or shared."""
    return tuple(
        Side.POOL
        if spec.scope == pool
        else Side.OWN
        if spec.scope.split(":", 1)[0] in OWN_SCOPE_KINDS
        else Side.SHARED
        for spec in buckets
    )


def lane_of(buckets: Sequence[BucketSpec], sides: Sequence[Side]) -> str:
    """A waiter's lane in its flow: who holds it by its own limits (its ``Side.OWN`` buckets,
    as a short hash; '' when it has none). Waiters with the same own buckets share a lane."""
    own = sorted(
        f"{b.scope}\x1f{b.name}" for b, side in zip(buckets, sides, strict=True) if side is Side.OWN
    )
    if not own:
        return ""
    return hashlib.blake2b("\x1e".join(own).encode(), digest_size=8).hexdigest()


def lane_key(flow: str, lane: str) -> str:
    """A lane's name in its pool's queue (the Lua's too: its list key and its parked member)."""
    return f"{flow}\x1f{lane}"


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one gets everything."""
    if not values:
        return 1.0
    total, squares = sum(values), sum(x * x for x in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


def weighted_max_min(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min fair shares (water-filling): no one gets more than it asks for, the
    rest is split in proportion to weight among those who want more."""
    shares = {name: 0.0 for name in demands}
    open_ = {name for name, d in demands.items() if d > 0}
    left = capacity
    while open_ and left > 1e-12:
        total_weight = sum(weights[n] for n in open_)
        level = left / total_weight
        capped = {n for n in open_ if demands[n] - shares[n] <= level * weights[n]}
        if not capped:
            for n in open_:
                shares[n] += level * weights[n]
            break
        for n in capped:
            left -= demands[n] - shares[n]
            shares[n] = demands[n]
        open_ -= capped
    return shares
