"""A configured limit's fields → the core's ``BucketSpec`` (B1, B3), without Django.

``quotas.snapshot.bucket_spec`` feeds it a ``Bucket`` row's fields; the switchback simulation
feeds it a parsed configuration file's ``LimitSpec``, so both see the very same buckets.
"""

from __future__ import annotations

import datetime as dt

from quotas.core.model import BucketSpec, Dimension, Rule, Window

# A ramp with no configured floor may always send this many requests per interval, so traffic
# can start from idle; from there it may grow by the configured factor per interval.
RAMP_DEFAULT_FLOOR = 20.0


def bucket_spec_build(
    *,
    name: str,
    scope: str,
    dimension: str,
    rule: str,
    capacity: float | None,
    period_seconds: float | None,
    duration_seconds: float | None,
    window: str,
    resets_at: dt.time | None,
    timezone: str,
    factor: float | None,
    shadow: bool,
) -> BucketSpec:
    """The core's view of one configured limit; ``scope`` becomes its Redis hash tag."""
    kind = Rule(rule)
    cap: float | None = capacity
    period: float | None = period_seconds
    if kind is Rule.RAMP:
        dim = Dimension.REQUESTS
        cap = capacity or RAMP_DEFAULT_FLOOR
        period = period_seconds or 60.0
    elif kind is Rule.ROLLING_WINDOW:
        dim, period = Dimension(dimension), duration_seconds
    else:
        dim = Dimension(dimension)
    reset_seconds = 0.0
    if resets_at is not None:
        reset_seconds = resets_at.hour * 3600 + resets_at.minute * 60 + resets_at.second
    return BucketSpec(
        name=name,
        scope=scope,
        dimension=dim,
        rule=kind,
        capacity=float(cap or 0.0),
        period=float(period or 0.0),
        window=Window(window) if window else None,
        resets_at=reset_seconds,
        timezone=timezone or "UTC",
        factor=float(factor or 1.0),
        shadow=shadow,
    )
