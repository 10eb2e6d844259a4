"""One pool's fair queue as data (pure): its waiters (``Entry``), their flows of FIFO lanes
(``Flow``), the pool's virtual time, tags, heads and verdicts (``PoolQueue``), and the reads
over them that decide nothing. ``queuebook.QueueBook`` runs the queue's steps over these.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from quotas.core.fairqueue import Side, Verdict, drained
from quotas.core.model import INF, BucketSpec, Rule, Usage

# A pool's verdicts are pruned of expired ones once they are more than this many.
VERDICTS_KEPT = 4096


# Compared by identity: a pool holds one entry per reservation id, so ``lane.remove(entry)``
# finds the same object without comparing every field of every waiter before it.
@dataclass(slots=True, eq=False)
class Entry:
    reservation_id: str
    flow: str
    buckets: tuple[BucketSpec, ...]
    demand: Usage
    sides: tuple[Side, ...]
    weight: float
    cost: float
    burst: float
    deadline: float
    lease: float
    mailbox: str
    # ``demand_parts(buckets, demand)``, and the rules below: made once, while the pump may try
    # a waiter many times.
    parts: list[tuple[BucketSpec, float]]
    lane: str  # ``fairqueue.lane_of``: the holder of its own limits
    _rules: dict[str, Rule] | None = field(default=None, init=False, repr=False)
    _pool_rules: dict[str, Rule] | None = field(default=None, init=False, repr=False)
    _drained: tuple[tuple[BucketSpec, ...], list[float]] | None = field(
        default=None, init=False, repr=False
    )

    def drained(self) -> tuple[tuple[BucketSpec, ...], list[float]]:
        """The pool's buckets whose drain is foreseen (``fairqueue.drained``) and the amounts
        asked of them: made once, while each newcomer behind this waiter reads them."""
        if self._drained is None:
            kept = [
                (spec, amount)
                for (spec, amount), side in zip(self.parts, self.sides, strict=True)
                if side is Side.POOL and drained(spec)
            ]
            self._drained = tuple(spec for spec, _ in kept), [amount for _, amount in kept]
        return self._drained

    def rules(self, *, pool_only: bool = False) -> dict[str, Rule]:
        """Rule by bucket name (of the pool's buckets only, if asked); do not modify it."""
        if pool_only:
            if self._pool_rules is None:
                self._pool_rules = self._rules_of(pool_only=True)
            return self._pool_rules
        if self._rules is None:
            self._rules = self._rules_of(pool_only=False)
        return self._rules

    def _rules_of(self, *, pool_only: bool) -> dict[str, Rule]:
        sides = zip(self.buckets, self.sides, strict=True)
        return {b.name: b.rule for b, side in sides if side is Side.POOL or not pool_only}


@dataclass(slots=True)
class Flow:
    """One flow's waiters in FIFO lanes (``fairqueue.lane_of``), and the ring of its lanes not
    parked: the first waiter of the ring's first lane is the flow's head."""

    lanes: dict[str, deque[Entry]] = field(default_factory=dict)  # non-empty lanes only
    ring: deque[str] = field(default_factory=deque)  # round robin; a parked lane is out of it
    size: int = 0  # waiters in all its lanes

    def __len__(self) -> int:
        return self.size


@dataclass(slots=True)
class PoolQueue:
    """One pool's queue: virtual time, per-flow finish tags, flows of FIFO lanes, their heads."""

    v: float = 0.0
    next_fit: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)
    flows: dict[str, Flow] = field(default_factory=dict)
    heads: list[tuple[float, str]] = field(default_factory=list)  # sorted (start tag, id)
    head_of: dict[str, float] = field(default_factory=dict)  # head id → start tag
    entries: dict[str, Entry] = field(default_factory=dict)
    deadlines: list[tuple[float, str]] = field(default_factory=list)  # heap, lazily cleaned
    # ``lane_key(flow, lane)`` of a lane held by its own limit → until (an emptied lane's stays
    # until due or until the lane starts afresh)
    parked: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, tuple[Verdict, float]] = field(default_factory=dict)  # id → (v, until)
    verdicts_prune_at: int = VERDICTS_KEPT  # prune when ``verdicts`` grows past this

    def retry_hint(self, now: float) -> float:
        """When to tell a refused client to come back: the pool's last known next fit."""
        return self.next_fit if now < self.next_fit < INF else now


def verdicts_prune(pq: PoolQueue, now: float) -> None:
    """Drop the expired verdicts (``leave`` ignores them anyway). A busy pool may hold more
    live verdicts than ``VERDICTS_KEPT``: the next prune then waits until the table has
    doubled, so pruning stays linear instead of rebuilding the table on every drop."""
    pq.verdicts = {k: kv for k, kv in pq.verdicts.items() if kv[1] > now}
    pq.verdicts_prune_at = max(VERDICTS_KEPT, 2 * len(pq.verdicts))


def next_due(pq: PoolQueue, now: float) -> Entry | None:
    """The waiter whose deadline came first, if it has come; stale heap items are dropped."""
    while pq.deadlines:
        deadline, rid = pq.deadlines[0]
        entry = pq.entries.get(rid)
        if entry is None or entry.deadline != deadline:
            heapq.heappop(pq.deadlines)  # already gone
            continue
        return entry if deadline <= now else None
    return None


def longest_flow(pq: PoolQueue) -> tuple[str, int]:
    """The flow with the most waiters, and their number (whom a full queue refuses from)."""
    # Ties go to the greatest flow name, as Redis's ZREVRANGE orders them.
    size, name = max((q.size, name) for name, q in pq.flows.items())
    return name, size


def newest_waiter(flow: Flow) -> Entry:
    """Whom a full queue evicts from a flow: the newest waiter of its longest lane (its
    busiest app's), not a quieter app's. Ties go to the greatest lane, as the Lua's do."""
    _, lane = max((len(q), name) for name, q in flow.lanes.items())
    return flow.lanes[lane][-1]
