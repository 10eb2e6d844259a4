"""Fixed-window boundaries in a time zone, and the per-call numbers a bucket rule needs.

A fixed window resets at a wall-clock time (e.g. daily 00:00 America/Los_Angeles), so windows
are 23 or 25 hours long on DST days. Boundaries are computed here, in Python with zoneinfo, and
handed to the arithmetic (and to Lua) as plain epoch seconds: four consecutive resets around
``now`` so that a store whose clock differs slightly from the caller's still finds its window.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from quotas.core.model import BucketSpec, Rule, Window

Boundaries = tuple[float, float, float, float]


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _instant(wall: datetime, zone: ZoneInfo) -> float:
    # fold=0: an ambiguous wall time (fall back) is its first occurrence; a wall time in a
    # spring-forward gap maps to the instant after the gap. Either way resets stay ordered.
    return wall.replace(tzinfo=zone, fold=0).timestamp()


def _floor_wall(wall: datetime, window: Window, resets_at: float) -> datetime:
    """The latest wall-clock reset at or before ``wall`` (naive local time)."""
    offset = timedelta(seconds=resets_at)
    if window is Window.HOUR:
        within = timedelta(seconds=resets_at % 3600)
        start = wall.replace(minute=0, second=0, microsecond=0) + within
        return start if start <= wall else start - timedelta(hours=1)
    if window is Window.DAY:
        start = datetime.combine(wall.date(), time()) + offset
        return start if start <= wall else start - timedelta(days=1)
    if window is Window.WEEK:
        monday = wall.date() - timedelta(days=wall.weekday())
        start = datetime.combine(monday, time()) + offset
        return start if start <= wall else start - timedelta(days=7)
    first = datetime.combine(date(wall.year, wall.month, 1), time()) + offset
    return first if first <= wall else _step_wall(first, Window.MONTH, -1, resets_at)


def _step_wall(start: datetime, window: Window, steps: int, resets_at: float) -> datetime:
    if window is Window.HOUR:
        return start + timedelta(hours=steps)
    if window is Window.DAY:
        return start + timedelta(days=steps)
    if window is Window.WEEK:
        return start + timedelta(days=7 * steps)
    months = start.year * 12 + (start.month - 1) + steps
    first = date(months // 12, months % 12 + 1, 1)
    return datetime.combine(first, time()) + timedelta(seconds=resets_at)


def fixed_window_boundaries(
    now: float, window: Window, resets_at: float, timezone: str
) -> Boundaries:
    """Four consecutive reset instants b0 < b1 ≤ now < b2 < b3 (epoch seconds)."""
    zone = _zone(timezone)
    wall = datetime.fromtimestamp(now, UTC).astimezone(zone).replace(tzinfo=None)
    start = _floor_wall(wall, window, resets_at)
    if _instant(start, zone) > now:  # a wall time inside a DST gap mapped past now
        start = _step_wall(start, window, -1, resets_at)
    instants: list[float] = []
    for step in range(-3, 5):
        instant = _instant(_step_wall(start, window, step, resets_at), zone)
        if not instants or instant > instants[-1]:  # a reset lost in a DST gap is skipped
            instants.append(instant)
    i = max(k for k in range(len(instants)) if instants[k] <= now)
    return instants[i - 1], instants[i], instants[i + 1], instants[i + 2]


def window_of(bounds: Boundaries, now: float) -> tuple[float, float]:
    """The fixed window [start, end) that contains ``now`` (clamped to the known four)."""
    b0, b1, b2, b3 = bounds
    if now < b1:
        return (b0, b1) if now >= b0 else (b0 - (b1 - b0), b0)
    if now < b2:
        return b1, b2
    if now < b3:
        return b2, b3
    return b3, b3 + (b3 - b2)


def rule_numbers(spec: BucketSpec, now: float) -> Boundaries:
    """The four rule-specific numbers passed with a bucket on every call (x1..x4)."""
    if spec.rule is Rule.FIXED_WINDOW:
        assert spec.window is not None
        return fixed_window_boundaries(now, spec.window, spec.resets_at, spec.timezone)
    if spec.rule is Rule.ROLLING_WINDOW:
        return float(spec.slices), 0.0, 0.0, 0.0
    if spec.rule is Rule.RAMP or spec.learned:
        return spec.factor, 0.0, 0.0, 0.0
    return 0.0, 0.0, 0.0, 0.0


class BoundaryCache:
    """Reuses a bucket's boundaries while ``now`` stays in the same window (hot path)."""

    def __init__(self) -> None:
        self._cache: dict[BucketSpec, Boundaries] = {}

    def numbers(self, spec: BucketSpec, now: float) -> Boundaries:
        if spec.rule is not Rule.FIXED_WINDOW:
            return rule_numbers(spec, now)
        cached = self._cache.get(spec)
        if cached is not None and cached[1] <= now < cached[2] and math.isfinite(now):
            return cached
        fresh = rule_numbers(spec, now)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[spec] = fresh
        return fresh
