"""Provider-side limits: continuous-refill token buckets, a daily fixed window, concurrency.

Buckets refill linearly at ``capacity`` per minute (as Anthropic describes its limits) and start
full. The daily window counts requests per UTC day when ``now`` is epoch seconds (window index
``floor(now / 86400)``), or per simulated day when ``now`` starts at 0. A check and its debit are
one call (:meth:`ProviderLimits.try_admit`): all dimensions or none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from simulator.model.market import LimitsSpec

DAY = 86400.0
MINUTE = 60.0

Dimension = Literal["requests", "input_tokens", "output_tokens", "requests_per_day", "concurrency"]
RejectionReason = Literal[
    "requests_per_minute",
    "input_tokens_per_minute",
    "output_tokens_per_minute",
    "concurrency",
    "requests_per_day",
    "request_too_large",
    "model_not_found",
    "context_length_exceeded",
]
# When a concurrency slot frees is unknowable at admission; real clients are told to come back soon.
CONCURRENCY_RETRY_AFTER = 1.0


@dataclass
class TokenBucket:
    capacity: float
    refill_per_s: float
    level: float
    updated_at: float

    @classmethod
    def per_minute(cls, capacity: int, now: float) -> TokenBucket:
        return cls(float(capacity), capacity / MINUTE, float(capacity), now)

    def refill(self, now: float) -> None:
        elapsed = now - self.updated_at
        if elapsed > 0:  # a clock that steps back must not drain the bucket
            self.level = min(self.capacity, self.level + elapsed * self.refill_per_s)
            self.updated_at = now

    def wait_for(self, now: float, amount: float) -> float:
        """Seconds until ``amount`` fits (0 now, ``inf`` never: more than the capacity)."""
        self.refill(now)
        if amount > self.capacity:
            return math.inf
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.refill_per_s

    def take(self, now: float, amount: float) -> None:
        self.refill(now)
        self.level -= amount

    def give_back(self, now: float, amount: float) -> None:
        self.refill(now)
        self.level = min(self.capacity, self.level + amount)

    def time_to_full(self, now: float) -> float:
        self.refill(now)
        return (self.capacity - self.level) / self.refill_per_s


@dataclass
class DailyWindow:
    capacity: int
    used: int = 0
    window: int = 0

    def _roll(self, now: float) -> None:
        window = math.floor(now / DAY)
        if window != self.window:
            self.window, self.used = window, 0

    def remaining(self, now: float) -> int:
        self._roll(now)
        return max(0, self.capacity - self.used)

    def take(self, now: float) -> None:
        self._roll(now)
        self.used += 1

    def time_to_reset(self, now: float) -> float:
        return (math.floor(now / DAY) + 1) * DAY - now


@dataclass(frozen=True)
class DimensionStatus:
    """One limit as rate-limit headers describe it; ``reset_s``: seconds until fully replenished."""

    dimension: Dimension
    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True)
class LimitStatus:
    """Every enforced limit at one moment, protocol-neutral (the wire layer formats headers)."""

    dimensions: tuple[DimensionStatus, ...]

    def get(self, dimension: Dimension) -> DimensionStatus | None:
        for status in self.dimensions:
            if status.dimension == dimension:
                return status
        return None


@dataclass(frozen=True)
class LimitRefusal:
    reason: RejectionReason
    retryable: bool
    retry_after_s: float | None  # exact seconds until the request would fit; None: not retryable
    limit: int
    requested: int


class ProviderLimits:
    """The limits of one provider account; ``try_admit`` + ``release`` bracket each request."""

    def __init__(self, spec: LimitsSpec, now: float) -> None:
        self.spec = spec
        self.requests = _bucket(spec.requests_per_minute, now)
        self.input_tokens = _bucket(spec.input_tokens_per_minute, now)
        self.output_tokens = _bucket(spec.output_tokens_per_minute, now)
        self.daily = DailyWindow(spec.requests_per_day) if spec.requests_per_day else None
        if self.daily is not None:
            self.daily.window = math.floor(now / DAY)
        self.in_flight = 0

    def try_admit(self, now: float, input_tokens: int, output_tokens: int) -> LimitRefusal | None:
        """Debit every dimension and return None, or debit nothing and say why not."""
        if self.daily is not None and self.daily.remaining(now) < 1:
            return LimitRefusal("requests_per_day", False, None, self.daily.capacity, 1)
        checks: tuple[tuple[RejectionReason, TokenBucket | None, int], ...] = (
            ("requests_per_minute", self.requests, 1),
            ("input_tokens_per_minute", self.input_tokens, input_tokens),
            ("output_tokens_per_minute", self.output_tokens, output_tokens),
        )
        worst: LimitRefusal | None = None
        for reason, bucket, amount in checks:
            if bucket is None:
                continue
            wait = bucket.wait_for(now, amount)
            capacity = int(bucket.capacity)
            if math.isinf(wait):
                return LimitRefusal("request_too_large", False, None, capacity, amount)
            if wait > 0 and (worst is None or wait > (worst.retry_after_s or 0.0)):
                worst = LimitRefusal(reason, True, wait, capacity, amount)
        if worst is not None:
            return worst
        if self.spec.concurrency is not None and self.in_flight >= self.spec.concurrency:
            return LimitRefusal(
                "concurrency", True, CONCURRENCY_RETRY_AFTER, self.spec.concurrency, 1
            )
        for _, bucket, amount in checks:
            if bucket is not None:
                bucket.take(now, amount)
        if self.daily is not None:
            self.daily.take(now)
        self.in_flight += 1
        return None

    def undo_admit(self, now: float, input_tokens: int, output_tokens: int) -> None:
        """Take back a ``try_admit`` that a wider limit then refused (a key's, B2)."""
        for bucket, amount in (
            (self.requests, 1),
            (self.input_tokens, input_tokens),
            (self.output_tokens, output_tokens),
        ):
            if bucket is not None:
                bucket.give_back(now, amount)
        if self.daily is not None:
            self.daily.used = max(0, self.daily.used - 1)
        self.in_flight = max(0, self.in_flight - 1)

    def give_back_input(self, now: float, tokens: int) -> None:
        """Input tokens admitted but not counted after all (prompt-cache reads)."""
        if self.input_tokens is not None:
            self.input_tokens.give_back(now, tokens)

    def release(self, now: float, unused_output_tokens: int) -> None:
        """End of a request: free its concurrency slot and refund output tokens it did not use."""
        self.in_flight = max(0, self.in_flight - 1)
        if self.output_tokens is not None and unused_output_tokens > 0:
            self.output_tokens.give_back(now, unused_output_tokens)

    def status(self, now: float) -> LimitStatus:
        dimensions: list[DimensionStatus] = []
        buckets: tuple[tuple[Dimension, TokenBucket | None], ...] = (
            ("requests", self.requests),
            ("input_tokens", self.input_tokens),
            ("output_tokens", self.output_tokens),
        )
        for dimension, bucket in buckets:
            if bucket is not None:
                reset = bucket.time_to_full(now)
                remaining = max(0, math.floor(bucket.level))
                dimensions.append(
                    DimensionStatus(dimension, int(bucket.capacity), remaining, reset)
                )
        if self.daily is not None:
            remaining = self.daily.remaining(now)
            reset = self.daily.time_to_reset(now) if remaining < self.daily.capacity else 0.0
            dimensions.append(
                DimensionStatus("requests_per_day", self.daily.capacity, remaining, reset)
            )
        if self.spec.concurrency is not None:
            free = max(0, self.spec.concurrency - self.in_flight)
            dimensions.append(DimensionStatus("concurrency", self.spec.concurrency, free, 0.0))
        return LimitStatus(tuple(dimensions))


def status_merged(organisation: LimitStatus, key: LimitStatus) -> LimitStatus:
    """What one key's headers describe (B2): per dimension, the key's own limit where it has
    one, the organisation's where it does not."""
    own = {d.dimension: d for d in key.dimensions}
    merged = [own.pop(d.dimension, d) for d in organisation.dimensions]
    return LimitStatus((*merged, *own.values()))


def _bucket(per_minute: int | None, now: float) -> TokenBucket | None:
    return TokenBucket.per_minute(per_minute, now) if per_minute else None
