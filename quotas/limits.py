"""The ``limits`` entries of the file: each becomes one ``quotas.Bucket`` of its parent's scope.

A limit's rule follows from its keys; ``RULE_KEYS`` says which keys each rule needs and which
it refuses, so a limit that mixes two shapes is reported rather than half-applied.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from common.reader import (
    Invalid,
    Section,
    boolean,
    choice,
    clock_time,
    duration,
    positive_number,
    text,
    timezone_name,
)

DIMENSIONS = (
    "requests",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "spend",
    "concurrency",
    "ramp",
)
FIXED_WINDOWS = ("hour", "day", "week", "month")
ROLLING = "rolling"
RULES = ("refill", "fixed_window", "rolling_window", "concurrency", "ramp")


@dataclass(frozen=True)
class LimitSpec:
    """One ``limits`` entry; becomes one ``quotas.Bucket`` of its parent's scope."""

    path: str
    dimension: str
    rule: str
    capacity: float | None = None
    period_seconds: float | None = None
    window: str = ""
    resets_at: dt.time | None = None
    timezone: str = ""
    duration_seconds: float | None = None
    factor: float | None = None
    shadow: bool = False
    # Replaces the derived part of the bucket name (e.g. two daily limits in two time zones).
    label: str = ""


def ramp_factor(value: object) -> float:
    factor = positive_number(value)
    if factor <= 1:
        raise Invalid(f"must be a growth factor greater than 1, got {value}")
    return factor


bucket_label = text(100, r"[A-Za-z0-9_.:-]+", "a bucket name part (letters, digits, . _ : -)")


def parse_limit(s: Section) -> LimitSpec:
    """A limit's rule follows from its keys: ``per`` → refill, ``window: day`` → fixed window,
    ``window: rolling`` → rolling window, dimension concurrency / ramp → their own rules."""
    dimension = s.field("dimension", choice(*DIMENSIONS))
    window = s.field("window", choice(*FIXED_WINDOWS, ROLLING), "")
    rule = _limit_rule(s, dimension, window)
    spec = LimitSpec(
        path=s.path,
        dimension=dimension,
        rule=rule,
        capacity=s.field("capacity", positive_number, None),
        period_seconds=s.field("per", duration, None),
        window="" if window == ROLLING else window,
        resets_at=s.field(
            "resets_at", clock_time, dt.time(0, 0) if rule == "fixed_window" else None
        ),
        timezone=s.field("timezone", timezone_name, "UTC" if rule == "fixed_window" else ""),
        duration_seconds=s.field("duration", duration, None),
        factor=s.field("factor", ramp_factor, None),
        shadow=s.field("shadow", boolean, False),
        label=s.field("name", bucket_label, ""),
    )
    s.done()
    return spec


# Which keys each rule needs and which it refuses (beyond dimension, shadow and name).
RULE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "refill": (("capacity", "per"), ("duration", "resets_at", "timezone", "factor")),
    "fixed_window": (("capacity", "window"), ("per", "duration", "factor")),
    "rolling_window": (("capacity", "duration"), ("per", "resets_at", "timezone", "factor")),
    "concurrency": (
        ("capacity",),
        ("per", "window", "duration", "resets_at", "timezone", "factor"),
    ),
    "ramp": (("factor", "per"), ("window", "duration", "resets_at", "timezone")),
}


def _limit_rule(s: Section, dimension: str, window: str) -> str:
    if dimension in ("concurrency", "ramp"):
        rule = dimension
    elif s.has("per") and s.has("window"):
        s.errors.add(s.path, "give either 'per' (refill) or 'window' (fixed or rolling), not both")
        return ""
    elif s.has("per"):
        rule = "refill"
    elif window == ROLLING:
        rule = "rolling_window"
    elif window:
        rule = "fixed_window"
    else:
        if dimension is not None and not s.has("window"):
            s.errors.add(
                s.path,
                f"a {dimension} limit needs 'per' (e.g. per: 1m) or 'window' "
                "(e.g. window: day, or window: rolling with a duration)",
            )
        return ""
    needed, refused = RULE_KEYS[rule]
    what = f"a {rule.replace('_', ' ')} limit"
    for key in needed:
        if not s.has(key):
            s.errors.add(f"{s.path}.{key}", f"is required for {what}")
    for key in refused:
        if s.has(key):
            s.errors.add(f"{s.path}.{key}", f"is not allowed for {what}")
    return rule
