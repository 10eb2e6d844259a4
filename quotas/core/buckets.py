"""Per-bucket arithmetic of the five rules (B1, B3), mirrored line by line in lua/lib.lua.

Each rule has a small state (what Redis keeps in the bucket's hash) and four operations:
``view`` (what is available at ``now``; may prune expired slices or holders, which the Lua
writes too), ``fit_time`` (earliest time ``amount`` would fit with no other traffic),
``take`` and ``settle`` (replace a taken estimate by the actual amount: give back or charge
debt). A missing state is a new bucket; ``born`` is when the store's state began (0 for a
store that never lost it), and a refill bucket that was lost counts as empty at ``born``.

Float operations happen in the same order as in Lua, so both give bit-identical results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from quotas.core.model import INF, Rule
from quotas.core.windows import Boundaries, window_of

# Holders examined when computing when a full concurrency bucket frees up.
HOLDER_SCAN = 256
# The smallest wait a refusal names (Redis TIME has microseconds).
TICK = 1e-6
# A settle marker that matches no window, slice or interval: the amount is pure overage.
NO_MARKER = -1.0


@dataclass(frozen=True, slots=True)
class Resolved:
    """A bucket's numbers for one call: the spec's plus x1..x4 (see ``windows.rule_numbers``)."""

    rule: Rule
    capacity: float
    period: float
    x: Boundaries
    shadow: bool = False


@dataclass(slots=True)
class RefillState:
    level: float
    ts: float


@dataclass(slots=True)
class WindowState:
    wstart: float
    wend: float
    used: float


@dataclass(slots=True)
class RollingState:
    total: float
    lo: int
    hi: int
    slices: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True)
class ConcurrencyState:
    held: float
    holders: dict[str, tuple[float, float]] = field(default_factory=dict)  # id → (amount, expiry)
    # No holder's lease ends before this (kept by ``hold``): while ``now`` is earlier, ``view``
    # knows nothing expired without sorting the holders, which it would do on every call.
    soonest: float = field(default=INF, init=False)
    # A learned limit (``BucketSpec.learned``): ``learned`` as of ``learned_at``; INF until the
    # provider first refuses. It grows only while ``growing``: while it held requests back.
    learned: float = INF
    learned_at: float = 0.0
    growing: bool = False

    def __post_init__(self) -> None:
        self.soonest = min((expiry for _, expiry in self.holders.values()), default=INF)

    def hold(self, holder: str, amount: float, expiry: float) -> None:
        """Register ``holder`` (or move its expiry) without touching ``held``."""
        self.holders[holder] = (amount, expiry)
        self.soonest = min(self.soonest, expiry)

    def by_expiry(self) -> list[tuple[float, str, float]]:
        """(expiry, id, amount) rows, soonest first."""
        # Redis orders a sorted set by score, then by member bytes; str order matches for UTF-8.
        # Ids are unique, so the amount never decides the order.
        return sorted((expiry, hid, amount) for hid, (amount, expiry) in self.holders.items())


@dataclass(slots=True)
class RampState:
    cur: int
    cur_used: float
    prev_used: float


State = RefillState | WindowState | RollingState | ConcurrencyState | RampState


@dataclass(slots=True)
class View:
    """A bucket as seen at ``now``: ``state`` is what to keep (None: delete or never existed)."""

    state: State | None
    available: float
    # Rule-specific working values, so take/settle reuse what view computed.
    a: float = 0.0  # refill level, window start, slice index, ramp interval index
    b: float = 0.0  # window end, ramp current usage
    c: float = 0.0  # ramp previous usage


def _refill_level(st: RefillState | None, r: Resolved, now: float, born: float) -> float:
    if st is None:
        return min(r.capacity, (now - born) * r.capacity / r.period)
    if now > st.ts:
        return min(r.capacity, st.level + (now - st.ts) * r.capacity / r.period)
    return st.level


def _slice(r: Resolved, now: float) -> tuple[float, int, int]:
    width = r.period / r.x[0]
    return width, math.floor(now / width), math.floor((now - r.period) / width)


def _ramp_roll(st: RampState | None, r: Resolved, now: float) -> tuple[int, float, float]:
    idx = math.floor(now / r.period)
    if st is None:
        return idx, 0.0, 0.0
    if idx == st.cur:
        return idx, st.cur_used, st.prev_used
    if idx == st.cur + 1:
        return idx, 0.0, st.cur_used
    if idx > st.cur + 1:
        return idx, 0.0, 0.0
    return st.cur, st.cur_used, st.prev_used  # the clock went back: stay in the known interval


def view(st: State | None, r: Resolved, now: float, born: float, expire_limit: int) -> View:
    """Bring a bucket to ``now``. Rolling slices and concurrency holders that ran out are
    dropped here (at most ``expire_limit`` holders per call), exactly as the Lua does."""
    if r.rule is Rule.REFILL:
        assert st is None or isinstance(st, RefillState)
        level = _refill_level(st, r, now, born)
        return View(st, level, a=level)
    if r.rule is Rule.FIXED_WINDOW:
        assert st is None or isinstance(st, WindowState)
        start, end = window_of(r.x, now)
        used = st.used if st is not None and st.wstart == start else 0.0
        return View(st, r.capacity - used, a=start, b=end, c=used)
    if r.rule is Rule.ROLLING_WINDOW:
        assert st is None or isinstance(st, RollingState)
        _, k_now, k_min = _slice(r, now)
        if st is not None and k_min > st.hi:
            st = None  # everything slid out
        if st is not None and st.lo < k_min:
            last = min(k_min - 1, st.lo + int(r.x[0]) + 2)
            k = st.lo
            while k <= last:
                v = st.slices.pop(k, None)
                if v is not None:
                    st.total = st.total - v
                k += 1
            st.lo = k_min
        total = st.total if st is not None else 0.0
        return View(st, r.capacity - total, a=float(k_now))
    if r.rule is Rule.CONCURRENCY:
        assert st is None or isinstance(st, ConcurrencyState)
        if st is not None and st.soonest <= now:
            for expiry, hid, amount in st.by_expiry()[:expire_limit]:
                if expiry > now:
                    break
                del st.holders[hid]
                st.held = st.held - amount
            st.soonest = min((expiry for _, expiry in st.holders.values()), default=INF)
        if st is None:
            return View(st, r.capacity)
        return View(st, concurrency_capacity(st, r, now) - st.held)
    assert st is None or isinstance(st, RampState)
    idx, cur_used, prev_used = _ramp_roll(st, r, now)
    allowance = max(r.capacity, r.x[0] * prev_used)
    return View(st, allowance - cur_used, a=float(idx), b=cur_used, c=prev_used)


def concurrency_capacity(st: ConcurrencyState, r: Resolved, now: float) -> float:
    """A concurrency bucket's capacity at ``now``: a learned one grows by one per period while
    it is full (as TCP grows a window only while using it: idle time proves nothing)."""
    if st.learned == INF:
        return r.capacity
    if not st.growing:
        return st.learned
    return min(r.capacity, st.learned + (now - st.learned_at) / r.period)


def _learned_hold(st: ConcurrencyState, r: Resolved, now: float, change: float) -> None:
    """Change what a learned bucket holds: the growth so far is kept, and it grows from now
    on only if the bucket is then full (no room for one more)."""
    st.held = st.held + change
    if st.learned != INF:
        st.learned = concurrency_capacity(st, r, now)
        st.learned_at = now
        st.growing = st.held + 1 > st.learned


def fit_time(v: View, r: Resolved, now: float, amount: float) -> float:
    """Earliest time ``amount`` fits if nothing else happens; ``now`` if it fits; inf if never."""
    if amount <= v.available:
        return now
    if r.rule is Rule.REFILL:
        # One tick later than exact, so that at retry_at it fits despite float rounding.
        return now + (amount - v.available) * r.period / r.capacity + TICK
    if r.rule is Rule.FIXED_WINDOW:
        return v.b
    if r.rule is Rule.ROLLING_WINDOW:
        st = v.state
        assert st is None or isinstance(st, RollingState)
        if st is None:
            return now
        width = r.period / r.x[0]
        need = amount - v.available
        freed = 0.0
        k = st.lo
        while k <= st.hi:
            freed = freed + st.slices.get(k, 0.0)
            if freed >= need:
                return (k + 1.0) * width + r.period
            k += 1
        return (st.hi + 1.0) * width + r.period
    if r.rule is Rule.CONCURRENCY:
        st = v.state
        assert st is None or isinstance(st, ConcurrencyState)
        if st is None:
            return now
        need = amount - v.available
        freed = 0.0
        for expiry, _, held in st.by_expiry()[:HOLDER_SCAN]:
            freed = freed + held
            if freed >= need:
                return max(now, expiry)
        return INF
    next_allowance = max(r.capacity, r.x[0] * v.b)
    return (v.a + 1) * r.period if amount <= next_allowance else INF


def take(
    v: View, r: Resolved, now: float, amount: float, holder: str, expiry: float
) -> tuple[State, float]:
    """Take ``amount`` (the caller checked it fits); returns the new state and the marker."""
    st = v.state
    if r.rule is Rule.REFILL:
        ts = st.ts if isinstance(st, RefillState) and st.ts > now else now
        return RefillState(v.a - amount, ts), 0.0
    if r.rule is Rule.FIXED_WINDOW:
        return WindowState(v.a, v.b, v.c + amount), v.a
    if r.rule is Rule.ROLLING_WINDOW:
        return _rolling_add(st, int(v.a), amount), v.a
    if r.rule is Rule.CONCURRENCY:
        assert st is None or isinstance(st, ConcurrencyState)
        if st is None:
            st = ConcurrencyState(0.0)
        _learned_hold(st, r, now, amount)
        st.hold(holder, amount, expiry)
        return st, 0.0
    return RampState(int(v.a), v.b + amount, v.c), v.a


def _rolling_add(st: State | None, k: int, amount: float) -> RollingState:
    assert st is None or isinstance(st, RollingState)
    if st is None:
        return RollingState(amount, k, k, {k: amount})
    st.slices[k] = st.slices.get(k, 0.0) + amount
    st.total = st.total + amount
    st.hi = max(st.hi, k)
    st.lo = min(st.lo, k)
    return st


def settle(
    v: View, r: Resolved, now: float, taken: float, actual: float, marker: float, holder: str
) -> State | None:
    """Replace ``taken`` by ``actual``: give back to the window it came from if that window is
    still current, charge overage as debt. Concurrency releases ``holder``. Returns the state
    to keep; ``v.state`` unchanged means nothing to write."""
    st = v.state
    diff = actual - taken
    if r.rule is Rule.REFILL:
        ts = st.ts if isinstance(st, RefillState) and st.ts > now else now
        return RefillState(min(r.capacity, v.a - diff), ts)
    if r.rule is Rule.FIXED_WINDOW:
        if marker == v.a:
            return WindowState(v.a, v.b, max(0.0, v.c + diff))
        if diff > 0:
            return WindowState(v.a, v.b, v.c + diff)
        return st
    if r.rule is Rule.ROLLING_WINDOW:
        if diff > 0:
            return _rolling_add(st, int(v.a), diff)
        if isinstance(st, RollingState) and diff < 0:
            k = int(marker) if marker >= 0 else -1
            if k >= st.lo and k in st.slices:
                have = st.slices[k]
                back = min(have, -diff)
                st.slices[k] = have - back
                st.total = st.total - back
        return st
    if r.rule is Rule.CONCURRENCY:
        if isinstance(st, ConcurrencyState) and holder in st.holders:
            amount, _ = st.holders.pop(holder)
            _learned_hold(st, r, now, -amount)
        return st
    assert st is None or isinstance(st, RampState)
    idx, cur_used, prev_used = int(v.a), v.b, v.c
    if marker == v.a:
        cur_used = max(0.0, cur_used + diff)
    elif marker == v.a - 1:
        prev_used = max(0.0, prev_used + diff)
    elif diff > 0:
        cur_used = cur_used + diff
    else:
        return st
    return RampState(idx, cur_used, prev_used)


def observe(v: View, r: Resolved, now: float, remaining: float, reset_at: float) -> State | None:
    """Tighten the view from a provider's headers: never above what the rule allows (C12)."""
    st = v.state
    if r.rule is Rule.REFILL:
        target = remaining
        if reset_at > now:
            target = min(target, r.capacity - (reset_at - now) * r.capacity / r.period)
        if target < v.a:
            ts = st.ts if isinstance(st, RefillState) and st.ts > now else now
            return RefillState(target, ts)
        return st
    if r.rule is Rule.FIXED_WINDOW:
        floor_used = r.capacity - remaining
        if floor_used > v.c:
            return WindowState(v.a, v.b, floor_used)
        return st
    if r.rule is Rule.ROLLING_WINDOW:
        if remaining < v.available:
            return _rolling_add(st, int(v.a), v.available - remaining)
        return st
    if r.rule is Rule.CONCURRENCY and r.period > 0 and isinstance(st, ConcurrencyState):
        # The provider refused with st.held in flight (at most: ours count until settled) and
        # room for ``remaining`` more. Only a refusal within the learned limit says the limit
        # is too high; one above it was sent before the last cut and is old news.
        seen = st.held + remaining
        if 1 <= seen < concurrency_capacity(st, r, now):
            st.learned = max(1.0, r.x[0] * seen)
            st.learned_at = now
            st.growing = st.held + 1 > st.learned
    return st


def adopt(st: State | None, amount: float, holder: str, expiry: float) -> ConcurrencyState:
    """Re-register a lease that was in flight when the store lost its state (no capacity check)."""
    assert st is None or isinstance(st, ConcurrencyState)
    if st is None:
        st = ConcurrencyState(0.0)
    if holder not in st.holders:
        st.held = st.held + amount
    st.hold(holder, amount, expiry)
    return st
