"""Allowances: capacity one gateway process takes for several requests at once (issue 19).

A request's reservation is two Lua calls to Redis, ~150–230 µs of Redis time and two round
trips on its path. While every bucket of a bucket set has plenty left, a process instead takes
an *allowance* — one ordinary reservation of ``size`` requests' demand in all of the set's
buckets, with its own lease — and grants the set's next requests out of it, with no Redis
call, settling their actual usage into it. When the allowance is spent, old or its buckets'
windows move on, it takes no more requests; once its last request has settled it is reconciled
in Redis with the usage of every request it granted, so the buckets end up charged what the
requests used, as if each had reserved on its own.

Why it never over-admits (C4): every unit an allowance hands out was taken from the buckets in
Redis first, by a reservation no other process can see the same capacity for. Why it does not
change who gets scarce capacity (D2, E1): an allowance is only taken when, after it, each
bucket would still hold ``floor`` of its capacity — under contention every request reserves
on its own, through the fair queue, exactly as before — and once a request of the process
shows one of its buckets under ``floor`` (``short``), or is refused or queued, the allowances
that hold from that bucket grant no more. A process that dies leaves its
allowance to its lease (C9): its concurrency comes back, and what it took stays counted, as a
reaped reservation's estimates stay counted; the ledger then has the allowance's reservation
row (the reap's), not one for each of its requests that was still in flight. Every answered
request has its own row, appended before its answer goes out (I2).

A 429 stops the provider's allowances at once (``quotas.allowances``): a learned concurrency
limit is then cut to what is in flight, the allowance's slots included, and they come back
when it is reconciled. Not for streams in steps (they extend their own reservation). Pure: the
clock is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from quotas.core.book import reserve_amount
from quotas.core.model import BucketSpec, GrantPart, Rule, Usage
from quotas.core.windows import fixed_window_boundaries, window_of

# Usage's fields an allowance counts: what a request's demand takes from each dimension.
FIELDS = ("requests", "input_tokens", "output_tokens", "spend", "concurrency")
# No request is granted this close to the end of the allowance's window, slice or interval: the
# process's clock and Redis's may differ by a little.
MARGIN_SECONDS = 0.5


def suits(specs: Sequence[BucketSpec], demand: Usage) -> bool:
    """Whether requests like ``demand`` on these buckets may be granted from an allowance."""
    return bool(specs) and demand.output_max <= 0  # a stream in steps extends its own


# Requests of one set differ in their tokens and spend (the prompt's length): an allowance sized
# from one request holds this much more of them per request, so that its neighbours fit too.
SLACK = 2.0


def allowance_unit(demand: Usage) -> Usage:
    """What an allowance holds per request, sized from ``demand``: one request and one slot,
    ``SLACK`` times its tokens and spend."""
    return Usage(
        requests=demand.requests,
        input_tokens=demand.input_tokens * SLACK,
        output_tokens=demand.output_tokens * SLACK,
        spend=demand.spend * SLACK,
        concurrency=demand.concurrency,
    )


def scaled(demand: Usage, size: int) -> Usage:
    """The demand of ``size`` requests like ``demand``: what an allowance reserves."""
    return Usage(**{name: getattr(demand, name) * size for name in FIELDS})


# An allowance for fewer requests than this is not worth its two calls (take and reconcile).
SMALLEST = 2
# One allowance holds at most this share of any of its buckets: what it holds is out of the
# fair queue's reach until it is reconciled (seconds: quotas.allowances), and a refill bucket
# that fills up meanwhile loses what comes back unused.
SHARE = 0.1


def spare(parts: Sequence[GrantPart], demand: Usage, most: int, floor: float) -> int:
    """How many requests like ``demand`` the buckets a grant showed can spare an allowance
    for, at most ``most``: each keeps at least ``floor`` of its capacity after it (from what
    the grant says was left, so a little later others may have taken some) and gives it at
    most ``SHARE`` of its capacity. 0: none."""
    if not parts:
        return 0
    size = most
    for part in parts:
        if part.skipped or part.remaining is None:
            return 0
        spec = part.bucket
        amount = reserve_amount(spec, demand)
        if amount > 0:
            room = min(part.remaining - floor * spec.capacity, SHARE * spec.capacity)
            size = min(size, math.floor(room / amount))
    return size if size >= SMALLEST else 0


def short(parts: Sequence[GrantPart], floor: float) -> frozenset[BucketSpec]:
    """The buckets a grant showed with less than ``floor`` of their capacity left: contended,
    so no allowance should keep granting from them."""
    return frozenset(
        part.bucket
        for part in parts
        if not part.skipped
        and part.remaining is not None
        and part.remaining < floor * part.bucket.capacity
    )


def usable_until(parts: Sequence[GrantPart], created_at: float) -> float:
    """Until when an allowance granted at ``created_at`` may grant: not past the fixed window,
    rolling-window slice or ramp interval its parts were taken in (a request granted later
    would count in one that is gone, not in the current one). ``inf``: no such bound."""
    until = math.inf
    for part in parts:
        spec = part.bucket
        if spec.rule is Rule.FIXED_WINDOW:
            assert spec.window is not None
            bounds = fixed_window_boundaries(created_at, spec.window, spec.resets_at, spec.timezone)
            until = min(until, window_of(bounds, created_at)[1])
        elif spec.rule is Rule.ROLLING_WINDOW:
            width = spec.period / spec.slices
            until = min(until, (part.marker + 1) * width)
        elif spec.rule is Rule.RAMP:
            until = min(until, (part.marker + 1) * spec.period)
    return until - MARGIN_SECONDS


# The next allowance is taken while this much of the current one's requests is left: it
# arrives before this one is spent, so the set's requests do not fall back to reserving on their
# own (two Lua calls each) while an allowance is on its way.
RENEW_SHARE = 0.25


@dataclass
class Allowance:
    """An allowance for ``size`` requests of ``per_request`` each (``allowance_unit``): what
    is left of it, what its requests used, and how many are in flight. ``usable_until``: no
    request is granted at or after it."""

    per_request: Usage
    size: int
    usable_until: float
    reserved: Usage = field(init=False)
    left: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)
    cached_input_tokens: float = 0.0
    in_flight: int = 0
    granted: int = 0
    retired: bool = False

    def __post_init__(self) -> None:
        self.reserved = scaled(self.per_request, self.size)
        self.left = {name: getattr(self.reserved, name) for name in FIELDS}
        self.used = dict.fromkeys(FIELDS, 0.0)

    def take(self, demand: Usage, now: float) -> bool:
        """Grant ``demand`` from what is left, all of it or nothing."""
        if self.retired or now >= self.usable_until:
            return False
        left = self.left
        for name in FIELDS:
            if getattr(demand, name) > left[name]:
                return False
        for name in FIELDS:
            left[name] -= getattr(demand, name)
        self.in_flight += 1
        self.granted += 1
        return True

    def settle(self, demand: Usage, actual: Usage) -> None:
        """A granted request ended having used ``actual``: what it did not use is left for
        the next ones, what it used beyond its demand is owed (the reconcile charges it), and
        its concurrency comes back."""
        for name in FIELDS:
            spent = 0.0 if name == "concurrency" else getattr(actual, name)
            self.left[name] += getattr(demand, name) - spent
            self.used[name] += spent
        self.cached_input_tokens += actual.cached_input_tokens
        self.in_flight -= 1

    def release(self, demand: Usage) -> None:
        """A granted request ended unsent: all of it comes back."""
        self.settle(demand, Usage(requests=0.0, concurrency=0.0))

    @property
    def spent(self) -> bool:
        """It might not grant one more request: what is left is short of ``per_request``."""
        return any(getattr(self.per_request, name) > self.left[name] for name in FIELDS)

    @property
    def running_low(self) -> bool:
        """Time to take the next one: a quarter or less of its requests left."""
        return self.left["requests"] <= RENEW_SHARE * self.reserved.requests

    @property
    def closable(self) -> bool:
        """Retired, with no request of its own in flight: it can be reconciled."""
        return self.retired and self.in_flight == 0

    def actual(self) -> Usage:
        """What its requests used, for reconciling the allowance's reservation (no slot counts
        as used: each came back when its request settled)."""
        return Usage(cached_input_tokens=self.cached_input_tokens, **self.used)
