"""Words of the canonical quota model (SPEC B1–B3, C4–C12): buckets, grants, refusals, settlements.

Plain frozen dataclasses, no behaviour beyond validation: the arithmetic is in ``buckets`` and
the reservation book in ``book``. Times are float epoch seconds; amounts are floats in the
bucket's dimension (requests, tokens, USD, concurrent requests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import StrEnum

INF = math.inf


class Rule(StrEnum):
    REFILL = "refill"  # token bucket: capacity C refilled continuously over period P
    FIXED_WINDOW = "fixed_window"  # resets at a wall-clock time in a time zone
    ROLLING_WINDOW = "rolling_window"  # usage over the trailing duration, in slices
    CONCURRENCY = "concurrency"  # held while in flight
    RAMP = "ramp"  # growth per interval ≤ factor × previous interval (floor = capacity)


class Dimension(StrEnum):
    REQUESTS = "requests"
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    TOTAL_TOKENS = "total_tokens"
    SPEND = "spend"
    CONCURRENCY = "concurrency"


class Window(StrEnum):
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"  # weeks start on Monday
    MONTH = "month"  # months start on the 1st


class Reason(StrEnum):
    """Why a bucket refuses; the first refusing bucket's reason is the reservation's."""

    BUCKET_EXHAUSTED = "bucket_exhausted"  # fits later (retry_at)
    UNSATISFIABLE = "unsatisfiable"  # amount > capacity: refuse at once, never queue
    PAUSED = "paused"  # the bucket's scope is paused (provider 429 + Retry-After, F2)
    RAMP_LIMITED = "ramp_limited"  # growth above factor × previous interval
    RECOVERING = "recovering"  # state was lost (Redis restart): conservative until retry_at


class Outcome(StrEnum):
    RECONCILED = "reconciled"
    RELEASED = "released"
    RENEWED = "renewed"
    ADOPTED = "adopted"  # renew of a lease lost with the store's state: re-registered
    EXPIRED = "expired"  # the lease ran out first: nothing changed (the estimate stands)
    CLOSED = "closed"  # already reconciled, released or expired: nothing changed
    UNKNOWN = "unknown"  # no such reservation (never granted, or forgotten): nothing changed
    EXTENDED = "extended"  # a live lease took more (a stream's next step, C10)
    REFUSED = "refused"  # a bucket refused the extension: nothing was taken


# Slices per rolling window unless configured: an amount counts for between D and D + D/60.
DEFAULT_SLICES = 60


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """One configured limit (B1). ``scope`` names the scope node and is the Redis hash tag.

    For RAMP, ``capacity`` is the floor: the allowance of an interval whatever the previous
    one used, so traffic can start from idle; ``dimension`` is what the ramp measures.

    For CONCURRENCY with a ``period``, the limit is *learned* (B1 source "learned"; see
    ``quotas.core.learned``): ``capacity`` is only its ceiling. A provider 429 that no known
    limit explains (``observe`` with little remaining) cuts it to ``factor`` × the requests
    then in flight; while it is full, it grows back by one request every ``period`` seconds.

    ``cached_input_free``: an input-token limit that does not count prompt-cache reads
    (Anthropic's ITPM on current models). The reservation takes the whole prompt — hits are
    known only afterwards — and settlement charges the uncached part, so cache-heavy traffic
    gets the capacity the provider really gives.

    ``counts_max_output``: an output- or total-token limit that counts a call's ``max_tokens``
    when the provider accepts it (OpenAI, Azure OpenAI, Anthropic's OTPM). A stream that
    reserves its output in steps (C10) still takes its whole maximum here (``Usage.output_max``),
    since that is what the provider will count; its steps go to the other buckets only.
    """

    name: str
    scope: str
    dimension: Dimension
    rule: Rule
    capacity: float
    period: float = 0.0  # refill period, rolling duration or ramp interval (seconds)
    window: Window | None = None
    resets_at: float = 0.0  # fixed window: seconds after local midnight (hour: mod 3600)
    timezone: str = "UTC"
    slices: int = DEFAULT_SLICES
    factor: float = 1.0
    shadow: bool = False
    cached_input_free: bool = False
    counts_max_output: bool = False
    # Hashed once, when made: a request looks its buckets up by their specs ~25 times
    # (allowances are kept by their set of buckets), and hashing the fourteen fields cost
    # ~0.3 us each time (bench/results/gateway_cpu.md). Not compared: equal specs hash equal.
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[BucketSpec], tuple[object, ...]]:
        # Made anew where unpickled: a string's hash differs from process to process.
        return type(self), tuple(getattr(self, f.name) for f in fields(self) if f.init)

    def __post_init__(self) -> None:
        for name in ("capacity", "period", "resets_at", "factor"):
            object.__setattr__(self, name, float(getattr(self, name)))
        compared = tuple(getattr(self, f.name) for f in fields(self) if f.compare)
        object.__setattr__(self, "_hash", hash(compared))
        if not self.name or not self.scope:
            raise ValueError("a bucket needs a name and a scope")
        if "{" in self.scope or "}" in self.scope:
            raise ValueError("a scope may not contain braces (it is the Redis hash tag)")
        if not (self.capacity > 0 and math.isfinite(self.capacity)):
            raise ValueError(f"{self.name}: capacity (ramp: floor) must be positive")
        needs_period = (Rule.REFILL, Rule.ROLLING_WINDOW, Rule.RAMP)
        if self.rule in needs_period and not (self.period > 0 and math.isfinite(self.period)):
            raise ValueError(f"{self.name}: {self.rule} needs a positive period")
        if self.rule is Rule.FIXED_WINDOW and self.window is None:
            raise ValueError(f"{self.name}: a fixed window needs a window (hour/day/week/month)")
        if self.rule is Rule.ROLLING_WINDOW and self.slices < 1:
            raise ValueError(f"{self.name}: a rolling window needs at least one slice")
        if self.rule is Rule.RAMP and not self.factor > 0:
            raise ValueError(f"{self.name}: a ramp needs a positive factor")
        if self.learned and not 0 < self.factor < 1:
            raise ValueError(f"{self.name}: a learned concurrency limit cuts by a factor in (0, 1)")

    @property
    def learned(self) -> bool:
        """A concurrency limit learned from the provider's 429s (its capacity is a ceiling)."""
        return self.rule is Rule.CONCURRENCY and self.period > 0


# The ``Usage`` field of each dimension ("" for total tokens, a sum), looked up in a dict:
# reading ``Dimension.value`` goes through the enum's descriptor, and an amount is read for
# every bucket of every reservation.
USAGE_FIELDS = {d: "" if d is Dimension.TOTAL_TOKENS else d.value for d in Dimension}


@dataclass(frozen=True, slots=True)
class Usage:
    """Demand (estimated) or usage (actual) of one request, per dimension (C2, C6)."""

    requests: float = 1.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    spend: float = 0.0
    concurrency: float = 1.0
    cached_input_tokens: float = 0.0  # of input_tokens, read from a prompt cache (actual only)
    # A stream in steps (C10) reserves less output than its maximum: the maximum, for the
    # buckets that count it whatever is reserved (``BucketSpec.counts_max_output``); 0: none.
    output_max: float = 0.0

    def amount(self, dimension: Dimension) -> float:
        field_name = USAGE_FIELDS[dimension]
        if not field_name:  # total tokens: no field of its own
            return float(self.input_tokens + self.output_tokens)
        return float(getattr(self, field_name))


NOTHING = Usage(requests=0.0, concurrency=0.0)


def sent_usage(demand: Usage) -> Usage:
    """What a failed attempt that reached the provider still counts (F4): its request and its
    estimated spend, whatever the answer — the provider counted the call against our rate and
    may bill it. Its tokens and its concurrency slot come back, as after any settlement."""
    return Usage(requests=demand.requests, spend=demand.spend, concurrency=0.0)


@dataclass(frozen=True, slots=True)
class GrantPart:
    """What one bucket gave: ``amount`` taken, in the window/slice/interval ``marker``."""

    bucket: BucketSpec
    amount: float
    marker: float = 0.0
    skipped: bool = False  # a shadow bucket that would have refused: nothing taken
    # What the bucket had left right after this grant (H1 metadata); None on a replay.
    remaining: float | None = None


@dataclass(frozen=True, slots=True)
class BucketRefusal:
    bucket: str
    reason: Reason
    retry_at: float


@dataclass(frozen=True, slots=True)
class Grant:
    """A reservation held as a lease until ``expires_at`` (C8, C9)."""

    reservation_id: str
    created_at: float
    expires_at: float
    parts: tuple[GrantPart, ...]
    shadow_refusals: tuple[BucketRefusal, ...] = ()
    replayed: bool = False  # the same id was reserved before: this is that grant again
    state: str = "active"  # active | reconciled | released | expired (replays may be closed)
    granted: bool = field(default=True, init=False)

    def taken(self) -> dict[str, float]:
        return {p.bucket.name: p.amount for p in self.parts}


@dataclass(frozen=True, slots=True)
class Refusal:
    """All or nothing: nothing was taken. ``bucket`` is the first refusing bucket (D1 order)."""

    reservation_id: str
    at: float
    bucket: str
    reason: Reason
    retry_at: float  # earliest time all refusing buckets could fit (inf: never, by waiting)
    refusals: tuple[BucketRefusal, ...]
    shadow_refusals: tuple[BucketRefusal, ...] = ()
    granted: bool = field(default=False, init=False)


@dataclass(frozen=True, slots=True)
class Settlement:
    """One bucket's reconciliation: the estimate, the actual usage, what went back or was added."""

    bucket: str
    estimated: float
    actual: float
    released: float
    charged: float


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    reservation_id: str
    outcome: Outcome
    at: float
    settlements: tuple[Settlement, ...] = ()


@dataclass(frozen=True, slots=True)
class RenewResult:
    reservation_id: str
    outcome: Outcome
    expires_at: float


@dataclass(frozen=True, slots=True)
class Extension:
    """What topping up a live lease did (C10 in steps; ``extend``): ``extended`` — ``grant``
    is the lease with its new amounts; ``refused`` — ``refusal`` names the bucket and reason,
    nothing was taken; or ``expired`` / ``closed`` / ``unknown`` — the lease no longer holds
    (settled first, ran out, never granted), nothing was taken."""

    reservation_id: str
    outcome: Outcome
    at: float
    grant: Grant | None = None
    refusal: Refusal | None = None


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    """An abandoned reservation found by ``reap``: its concurrency went back, estimates stand."""

    reservation_id: str
    created_at: float
    expires_at: float
    taken: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class BucketLevel:
    """What a bucket has left now, for response metadata (H1) and saturation pages."""

    bucket: str
    capacity: float
    available: float
    full_at: float  # when it would be full again with no more traffic
    paused_until: float = 0.0
