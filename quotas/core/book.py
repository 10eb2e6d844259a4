"""The reservation book: all-or-nothing multi-bucket reservations held as leases (C4–C12).

This is the in-memory store and the reference for ``store/lua/*.lua``: the same steps, the
same order, the same floats. Time is always a parameter. ``lose_state`` simulates a Redis
restart; the next call starts a learning period of one maximum lease (see README).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quotas.core import buckets as arith
from quotas.core.buckets import Resolved, State
from quotas.core.keys import bucket_key, record_key
from quotas.core.model import (
    INF,
    BucketLevel,
    BucketRefusal,
    BucketSpec,
    Dimension,
    ExpiredLease,
    Extension,
    Grant,
    GrantPart,
    Outcome,
    Reason,
    ReconcileResult,
    Refusal,
    RenewResult,
    Rule,
    Settlement,
    Usage,
)
from quotas.core.windows import Boundaries, BoundaryCache

# Rules whose lost state cannot be rebuilt from the clock: refused while learning.
LEARNING_RULES = (Rule.FIXED_WINDOW, Rule.ROLLING_WINDOW, Rule.CONCURRENCY)
# Specs whose key and numbers a book keeps at most (more: it starts over).
DERIVED_KEPT = 4096


@dataclass(slots=True)
class RecordPart:
    spec: BucketSpec
    amount: float
    marker: float
    skipped: bool
    # Of ``amount``, what was taken in earlier windows / slices / intervals than ``marker``'s
    # (a stream's step that landed past a boundary, ``extend``): counted as used where it was
    # taken; settling gives back or charges only the rest, in ``marker``'s.
    locked: float = 0.0


@dataclass(slots=True)
class Record:
    reservation_id: str
    key: str
    created: float
    expires: float
    state: str
    parts: list[RecordPart]


def resolve(spec: BucketSpec, x: Boundaries) -> Resolved:
    return Resolved(spec.rule, spec.capacity, spec.period, x, spec.shadow)


@dataclass(frozen=True, slots=True)
class Derived:
    """What every call needs from one spec: its state key and its numbers (``Resolved``).

    A simulation reserves on the same few specs millions of times; rebuilding the key and the
    numbers on each call was much of its time. ``spec`` is held so that the id this is cached
    under cannot be reused by another object while it is cached.
    """

    spec: BucketSpec
    key: str
    resolved: Resolved
    # The numbers hold for ``valid_from <= now < valid_until``: always, except a fixed window's
    # boundaries, which hold within the current window.
    valid_from: float
    valid_until: float
    ceiling: float  # a larger amount never fits: the capacity (a ramp's is a floor: none)
    learns: bool  # refused while the store is learning (``LEARNING_RULES``)
    short: Reason  # why an amount that does not fit now is refused


def derive(prefix: str, spec: BucketSpec, x: Boundaries) -> Derived:
    """``spec``'s key and its numbers for the rule numbers ``x`` (see ``BoundaryCache``)."""
    valid = (x[1], x[2]) if spec.rule is Rule.FIXED_WINDOW else (-INF, INF)
    ramp = spec.rule is Rule.RAMP
    return Derived(
        spec,
        bucket_key(prefix, spec),
        resolve(spec, x),
        *valid,
        ceiling=INF if ramp else spec.capacity,
        learns=spec.rule in LEARNING_RULES,
        short=Reason.RAMP_LIMITED if ramp else Reason.BUCKET_EXHAUSTED,
    )


def demand_parts(buckets: Sequence[BucketSpec], demand: Usage) -> list[tuple[BucketSpec, float]]:
    """Each bucket with its amount from the demand; buckets stay in the caller's (D1) order."""
    if len({(spec.scope, spec.name) for spec in buckets}) < len(buckets):
        seen: set[tuple[str, str]] = set()
        for spec in buckets:
            if (spec.scope, spec.name) in seen:
                raise ValueError(f"bucket {spec.name} appears twice in one reservation")
            seen.add((spec.scope, spec.name))
    if not buckets:
        raise ValueError("a reservation needs at least one bucket")
    return [(spec, reserve_amount(spec, demand)) for spec in buckets]


# The dimensions a provider's count of ``max_tokens`` lands in (``BucketSpec.counts_max_output``).
MAX_OUTPUT_DIMENSIONS = frozenset({Dimension.OUTPUT_TOKENS, Dimension.TOTAL_TOKENS})


def holds_max_output(spec: BucketSpec) -> bool:
    return spec.counts_max_output and spec.dimension in MAX_OUTPUT_DIMENSIONS


def reserve_amount(spec: BucketSpec, demand: Usage) -> float:
    """What a reservation takes from ``spec``: the demand's amount, with the output at its
    maximum in a bucket that counts the maximum (a stream in steps reserves less elsewhere)."""
    amount = demand.amount(spec.dimension)
    if holds_max_output(spec) and demand.output_max > demand.output_tokens:
        amount += demand.output_max - demand.output_tokens
    return amount


def extension_amount(spec: BucketSpec, more: Usage) -> float:
    """What a lease's extension takes from ``spec``: never a second concurrency slot, nor more
    output where the reservation already took the maximum."""
    if spec.rule is Rule.CONCURRENCY or spec.dimension is Dimension.CONCURRENCY:
        return 0.0
    if holds_max_output(spec):
        return 0.0
    return more.amount(spec.dimension)


def actual_amount(spec: BucketSpec, actual: Usage | None) -> float:
    if actual is None or spec.dimension is Dimension.CONCURRENCY:
        return 0.0
    if spec.cached_input_free and spec.dimension is Dimension.INPUT_TOKENS:
        return max(0.0, actual.input_tokens - actual.cached_input_tokens)
    return actual.amount(spec.dimension)


def decide(
    reservation_id: str, now: float, checks: Sequence[tuple[BucketSpec, Reason | None, float]]
) -> tuple[Refusal | None, tuple[BucketRefusal, ...]]:
    """All or nothing: the first refusing live bucket (D1 order) names the refusal; an
    unsatisfiable bucket wins, since waiting cannot help. Shadow refusals are information."""
    live: list[BucketRefusal] = []
    shadows: list[BucketRefusal] = []
    for spec, reason, retry_at in checks:
        if reason is not None:
            (shadows if spec.shadow else live).append(BucketRefusal(spec.name, reason, retry_at))
    shadow = tuple(shadows)
    if not live:
        return None, shadow
    unsatisfiable = next((r for r in live if r.reason is Reason.UNSATISFIABLE), None)
    first = live[0] if unsatisfiable is None else unsatisfiable
    retry_at = INF if unsatisfiable is not None else max(r.retry_at for r in live)
    refusal = Refusal(
        reservation_id, now, first.bucket, first.reason, retry_at, tuple(live), shadow
    )
    return refusal, shadow


class Book:
    """Bucket states, pauses and lease records of one store, driven with an explicit ``now``."""

    def __init__(
        self,
        *,
        prefix: str = "sy",
        max_lease_seconds: float = 30.0,
        retention_seconds: float = 300.0,
        expire_limit: int = 16,
    ) -> None:
        self.prefix = prefix
        self.max_lease_seconds = max_lease_seconds
        self.retention_seconds = retention_seconds
        self.expire_limit = expire_limit
        self.born = 0.0
        self.learning_until = 0.0
        self._epoch_present = True
        self._states: dict[str, State] = {}
        self._pauses: dict[str, float] = {}
        self._records: dict[str, Record] = {}
        self._index: dict[str, float] = {}
        self._bounds = BoundaryCache()
        self._derived: dict[int, Derived] = {}  # id(spec) → its key and numbers

    # -- the store's life ---------------------------------------------------------------
    def lose_state(self) -> None:
        """Forget everything, as a Redis restart without persistence would."""
        self._states.clear()
        self._pauses.clear()
        self._records.clear()
        self._index.clear()
        self._epoch_present = False

    def _epoch(self, now: float) -> None:
        if not self._epoch_present:
            self.born, self.learning_until = now, now + self.max_lease_seconds
            self._epoch_present = True

    def _record(self, key: str, now: float) -> Record | None:
        rec = self._records.get(key)
        if rec is not None and now >= rec.expires + self.retention_seconds:
            del self._records[key]
            return None
        return rec

    def _derive(self, spec: BucketSpec, now: float) -> Derived:
        """``spec``'s key and its numbers at ``now``, reused while they hold."""
        d = self._derived.get(id(spec))
        if d is None or d.spec is not spec or not d.valid_from <= now < d.valid_until:
            d = derive(self.prefix, spec, self._bounds.numbers(spec, now))
            if len(self._derived) >= DERIVED_KEPT:
                self._derived.clear()
            self._derived[id(spec)] = d
        return d

    def _view(self, key: str, r: Resolved, now: float) -> arith.View:
        v = arith.view(self._states.get(key), r, now, self.born, self.expire_limit)
        if v.state is None:
            self._states.pop(key, None)
        return v

    def _write(self, key: str, state: State | None) -> None:
        if state is None:
            self._states.pop(key, None)
        else:
            self._states[key] = state

    def paused_until(self, scope: str, now: float) -> float:
        until = self._pauses.get(scope, 0.0)
        return until if until > now else 0.0

    # -- reserve -------------------------------------------------------------------------
    def reserve(
        self,
        reservation_id: str,
        buckets: Sequence[BucketSpec],
        demand: Usage,
        *,
        now: float,
        lease_seconds: float,
    ) -> Grant | Refusal:
        """Take ``demand`` from every bucket or from none (C4); the same id twice → same grant."""
        parts = demand_parts(buckets, demand)
        return self.reserve_parts(reservation_id, parts, now=now, lease_seconds=lease_seconds)

    def reserve_parts(
        self,
        reservation_id: str,
        parts: Sequence[tuple[BucketSpec, float]],
        *,
        now: float,
        lease_seconds: float,
    ) -> Grant | Refusal:
        """``reserve`` with the parts ``demand_parts`` made (a queue keeps them per waiter)."""
        self._epoch(now)
        rkey = record_key(self.prefix, parts[0][0].scope, reservation_id)
        rec = self._record(rkey, now)
        if rec is not None:
            return self._replay(rec, now)
        expires = now + lease_seconds
        taken = self._take(reservation_id, parts, now=now, expires=expires)
        if isinstance(taken, Refusal):
            return taken
        kept, given, shadow = taken
        self._records[rkey] = Record(reservation_id, rkey, now, expires, "active", kept)
        self._index[rkey] = expires
        return Grant(reservation_id, now, expires, tuple(given), shadow)

    def _take(
        self,
        reservation_id: str,
        parts: Sequence[tuple[BucketSpec, float]],
        *,
        now: float,
        expires: float,
    ) -> Refusal | tuple[list[RecordPart], list[GrantPart], tuple[BucketRefusal, ...]]:
        """All or nothing over ``parts`` (lib.lua reserve_parts): a refusal, or what each part
        took (for the record and the grant) and the shadow refusals."""
        learning = now < self.learning_until
        checks: list[tuple[BucketSpec, Reason | None, float]] = []
        views: list[tuple[Derived, arith.View | None]] = []
        refused = False
        for spec, amount in parts:
            d = self._derive(spec, now)
            reason: Reason | None = None
            retry = now
            v: arith.View | None = None
            paused = self.paused_until(spec.scope, now)
            if amount > d.ceiling:
                reason, retry = Reason.UNSATISFIABLE, INF
            elif paused > now:
                reason, retry = Reason.PAUSED, paused
            elif learning and d.learns:
                reason, retry = Reason.RECOVERING, self.learning_until
            else:
                v = self._view(d.key, d.resolved, now)
                if amount > v.available:
                    reason, retry = d.short, arith.fit_time(v, d.resolved, now, amount)
            refused = refused or reason is not None
            checks.append((spec, reason, retry))
            views.append((d, v))
        shadow: tuple[BucketRefusal, ...] = ()
        if refused:
            refusal, shadow = decide(reservation_id, now, checks)
            if refusal is not None:
                return refusal
        kept: list[RecordPart] = []
        given: list[GrantPart] = []
        for (spec, amount), (d, v), (_, reason, _) in zip(parts, views, checks, strict=True):
            if reason is not None or v is None:  # a shadow bucket that would have refused
                left = v.available if v is not None else 0.0
                kept.append(RecordPart(spec, 0.0, 0.0, True))
                given.append(GrantPart(spec, 0.0, 0.0, True, left))
                continue
            state, marker = arith.take(v, d.resolved, now, amount, reservation_id, expires)
            self._write(d.key, state)
            kept.append(RecordPart(spec, amount, marker, False))
            given.append(GrantPart(spec, amount, marker, False, v.available - amount))
        return kept, given, shadow

    def _replay(self, rec: Record, now: float) -> Grant:
        state = "expired" if rec.state == "active" and rec.expires <= now else rec.state
        parts = _grant_parts(rec.parts)
        return Grant(rec.reservation_id, rec.created, rec.expires, parts, (), True, state)

    # -- reconcile / release -------------------------------------------------------------
    def settle(self, grant: Grant, actual: Usage | None, *, now: float) -> ReconcileResult:
        """Reconcile with ``actual`` usage, or release everything when ``actual`` is None."""
        self._epoch(now)
        rid = grant.reservation_id
        rec = self._record(record_key(self.prefix, grant.parts[0].bucket.scope, rid), now)
        if rec is None:
            return ReconcileResult(rid, Outcome.UNKNOWN, now)
        if rec.state != "active":
            return ReconcileResult(rid, Outcome.CLOSED, now)
        if rec.expires <= now:
            self._expire(rec)
            return ReconcileResult(rid, Outcome.EXPIRED, now)
        # Bucket definitions come with the call (as they do to Redis), matched by name.
        specs = {p.bucket.name: p.bucket for p in grant.parts}
        settlements: list[Settlement] = []
        for p in rec.parts:
            spec = specs.get(p.spec.name)
            if spec is None:
                continue
            a = actual_amount(spec, actual)
            if p.skipped:
                settlements.append(Settlement(spec.name, 0.0, a, 0.0, 0.0))
                continue
            taken, held = p.amount, a
            if p.locked > 0:  # only what was taken in the marker's window is settled there
                taken, held = p.amount - p.locked, max(0.0, a - p.locked)
            if held != taken or spec.rule is Rule.CONCURRENCY:
                # Exactly what it took (a request count, an exact estimate) changes nothing:
                # left as it is, as settle.lua does (one read and one write fewer in Redis).
                # Boundaries around the settle time: a window that rolled since is still found.
                d = self._derive(spec, now)
                v = self._view(d.key, d.resolved, now)
                self._write(d.key, arith.settle(v, d.resolved, now, taken, held, p.marker, rid))
            released, charged = max(0.0, taken - held), max(0.0, held - taken)
            settlements.append(Settlement(spec.name, p.amount, a, released, charged))
        rec.state = "released" if actual is None else "reconciled"
        self._index.pop(rec.key, None)
        outcome = Outcome.RELEASED if actual is None else Outcome.RECONCILED
        return ReconcileResult(rid, outcome, now, tuple(settlements))

    def _expire(self, rec: Record) -> None:
        for p in rec.parts:
            if p.spec.rule is Rule.CONCURRENCY and not p.skipped:
                st = self._states.get(bucket_key(self.prefix, p.spec))
                if isinstance(st, arith.ConcurrencyState) and rec.reservation_id in st.holders:
                    amount, _ = st.holders.pop(rec.reservation_id)
                    st.held = st.held - amount
        rec.state = "expired"
        self._index.pop(rec.key, None)

    # -- a stream's next step ----------------------------------------------------------
    def extend(self, grant: Grant, more: Usage, *, now: float) -> Extension:
        """Take ``more`` (a stream's next output step, C10) from the buckets a live lease
        holds, all or nothing, adding it to the lease's amounts so that settling reconciles
        against all it took. Concurrency and skipped shadow parts take nothing more. A lease
        no longer active takes nothing (an extension that lands after the settle is a no-op).
        """
        self._epoch(now)
        rid = grant.reservation_id
        rec = self._record(record_key(self.prefix, grant.parts[0].bucket.scope, rid), now)
        if rec is None:
            return Extension(rid, Outcome.UNKNOWN, now)
        if rec.state != "active":
            return Extension(rid, Outcome.CLOSED, now)
        if rec.expires <= now:
            self._expire(rec)
            return Extension(rid, Outcome.EXPIRED, now)
        specs = {p.bucket.name: p.bucket for p in grant.parts}
        rows: list[RecordPart] = []
        parts: list[tuple[BucketSpec, float]] = []
        for p in rec.parts:
            spec = specs.get(p.spec.name)
            if spec is None or p.skipped:
                continue
            amount = extension_amount(spec, more)
            if amount > 0:
                rows.append(p)
                parts.append((spec, amount))
        left: dict[str, float] = {}
        shadow: tuple[BucketRefusal, ...] = ()
        if parts:
            taken = self._take(rid, parts, now=now, expires=rec.expires)
            if isinstance(taken, Refusal):
                return Extension(rid, Outcome.REFUSED, now, refusal=taken)
            _, given, shadow = taken
            for row, part in zip(rows, given, strict=True):
                if part.skipped:  # a shadow bucket that would refuse: counted, not taken
                    continue
                if part.marker != row.marker:  # past a boundary: what came before stays there
                    row.locked = row.amount
                    row.marker = part.marker
                row.amount = row.amount + part.amount
                assert part.remaining is not None
                left[row.spec.name] = part.remaining
        by_name = {p.spec.name: p for p in rec.parts}
        new_parts = []
        for gp in grant.parts:
            kept = by_name.get(gp.bucket.name)
            if kept is None:
                new_parts.append(gp)
            else:
                remaining = left.get(gp.bucket.name)
                new_parts.append(
                    GrantPart(gp.bucket, kept.amount, kept.marker, kept.skipped, remaining)
                )
        extended = Grant(rid, rec.created, rec.expires, tuple(new_parts), shadow)
        return Extension(rid, Outcome.EXTENDED, now, grant=extended)

    # -- leases --------------------------------------------------------------------------
    def renew(self, grant: Grant, *, now: float, lease_seconds: float) -> RenewResult:
        """Extend a live lease; re-register one the store lost in a restart (then learn)."""
        self._epoch(now)
        rid = grant.reservation_id
        rkey = record_key(self.prefix, grant.parts[0].bucket.scope, rid)
        rec = self._record(rkey, now)
        expires = now + lease_seconds
        if rec is None:
            if self.born <= grant.created_at:
                return RenewResult(rid, Outcome.UNKNOWN, 0.0)
            parts = [RecordPart(p.bucket, p.amount, p.marker, p.skipped) for p in grant.parts]
            for p in parts:
                if p.spec.rule is Rule.CONCURRENCY and not p.skipped:
                    key = bucket_key(self.prefix, p.spec)
                    self._states[key] = arith.adopt(self._states.get(key), p.amount, rid, expires)
            self._records[rkey] = Record(rid, rkey, grant.created_at, expires, "active", parts)
            self._index[rkey] = expires
            return RenewResult(rid, Outcome.ADOPTED, expires)
        if rec.state != "active":
            return RenewResult(rid, Outcome.CLOSED, rec.expires)
        if rec.expires <= now:
            self._expire(rec)
            return RenewResult(rid, Outcome.EXPIRED, rec.expires)
        rec.expires = expires
        for p in rec.parts:
            if p.spec.rule is Rule.CONCURRENCY and not p.skipped:
                st = self._states.get(bucket_key(self.prefix, p.spec))
                if isinstance(st, arith.ConcurrencyState) and rid in st.holders:
                    st.hold(rid, st.holders[rid][0], expires)
        self._index[rkey] = expires
        return RenewResult(rid, Outcome.RENEWED, expires)

    def reap(self, *, now: float, limit: int) -> list[ExpiredLease]:
        """Expire up to ``limit`` abandoned leases (C9): their concurrency goes back."""
        self._epoch(now)
        due = sorted((exp, key) for key, exp in self._index.items() if exp <= now)[:limit]
        expired: list[ExpiredLease] = []
        for _, key in due:
            self._index.pop(key, None)
            rec = self._record(key, now)
            if rec is None or rec.state != "active":
                continue
            self._expire(rec)
            taken = tuple((p.spec.name, p.amount) for p in rec.parts)
            expired.append(ExpiredLease(rec.reservation_id, rec.created, rec.expires, taken))
        return expired

    # -- provider signals and direct charges ---------------------------------------------
    def pause(self, scope: str, until: float, *, now: float) -> float:
        """Pause a scope until ``until`` (F2); pauses only ever extend. Returns the pause end."""
        self._epoch(now)
        current = self.paused_until(scope, now)
        if until > current and until > now:
            self._pauses[scope] = until
            return until
        return current

    def observe(self, spec: BucketSpec, *, remaining: float, reset_at: float, now: float) -> float:
        """Lower a bucket to what the provider reports (C12); returns what is available."""
        self._epoch(now)
        d = self._derive(spec, now)
        v = self._view(d.key, d.resolved, now)
        self._write(d.key, arith.observe(v, d.resolved, now, remaining, reset_at))
        return self._view(d.key, d.resolved, now).available

    def charge(self, parts: Sequence[tuple[BucketSpec, float]], *, now: float) -> None:
        """Charge usage that bypassed reservation (e.g. a ledger replay after a restart)."""
        self._epoch(now)
        for spec, amount in parts:
            d = self._derive(spec, now)
            v = self._view(d.key, d.resolved, now)
            self._write(d.key, arith.settle(v, d.resolved, now, 0.0, amount, arith.NO_MARKER, ""))

    def refill_levels(
        self, buckets: Sequence[BucketSpec], *, now: float
    ) -> list[tuple[float, float]]:
        """Each refill bucket's available amount and refill per second at ``now``."""
        self._epoch(now)
        out: list[tuple[float, float]] = []
        for spec in buckets:
            d = self._derive(spec, now)
            r = d.resolved
            assert r.rule is Rule.REFILL
            out.append((self._view(d.key, r, now).available, r.capacity / r.period))
        return out

    def levels(self, buckets: Sequence[BucketSpec], *, now: float) -> list[BucketLevel]:
        """Available capacity and the time each bucket is full again (for H1 metadata)."""
        self._epoch(now)
        out: list[BucketLevel] = []
        for spec in buckets:
            d = self._derive(spec, now)
            r = d.resolved
            v = self._view(d.key, r, now)
            capacity = spec.capacity
            if isinstance(v.state, arith.ConcurrencyState):  # a learned limit's current value
                capacity = arith.concurrency_capacity(v.state, r, now)
            if spec.rule is Rule.RAMP:
                full_at = now if v.b == 0 else (v.a + 1) * spec.period
            else:
                full_at = arith.fit_time(v, r, now, capacity)
            paused = self.paused_until(spec.scope, now)
            out.append(BucketLevel(spec.name, capacity, v.available, full_at, paused))
        return out


def _grant_parts(parts: Sequence[RecordPart]) -> tuple[GrantPart, ...]:
    return tuple(GrantPart(p.spec, p.amount, p.marker, p.skipped) for p in parts)
