"""Parsers for provider rate-limit header values: durations, timestamps, Retry-After.

Every parser returns ``None`` for a missing or garbled value instead of raising: provider
headers are hints (SPEC C12), and a bad header must never fail a request that succeeded.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime

# Go's time.Duration.String(): "12ms", "1s", "6m0s", "23h47m36.648s", "1.5µs".
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # micro sign U+00B5, what Go prints
    "μs": 1e-6,  # Greek mu U+03BC
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def lower_keys(headers: Mapping[str, str]) -> dict[str, str]:
    """A plain dict with lower-cased names: any mapping then looks up like httpx.Headers."""
    return {str(name).lower(): str(value) for name, value in headers.items()}


def parse_number(value: str | None) -> float | None:
    """A finite, non-negative number, or None (Azure has been seen sending ``-1``)."""
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return number


def parse_go_duration(value: str | None) -> float | None:
    """Seconds in a Go duration string (``6m0s``); plain numbers are seconds (Azure's form)."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    plain = parse_number(text)
    if plain is not None:
        return plain
    position, total = 0, 0.0
    for match in _GO_DURATION.finditer(text):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        position = match.end()
    if position != len(text) or position == 0:
        return None
    return total


def parse_rfc3339(value: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp; a value without an offset is taken as UTC."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def seconds_until(value: str | None, *, now: float) -> float | None:
    """Seconds from ``now`` to an RFC 3339 time, floored at zero (the reset may already be past)."""
    moment = parse_rfc3339(value)
    if moment is None:
        return None
    return max(0.0, moment - now)


def parse_retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds to wait: ``retry-after-ms``, ``x-ms-retry-after-ms``, then ``retry-after``.

    ``retry-after`` may be delta-seconds or an HTTP-date (RFC 9110); ``headers`` must have
    lower-case names (see ``lower_keys``).
    """
    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        millis = parse_number(headers.get(name))
        if millis is not None:
            return millis / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = parse_number(raw)
    if seconds is not None:
        return seconds
    try:
        moment = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # RFC 9110 dates are GMT
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, moment.timestamp() - now)


def has_retry_after(headers: Mapping[str, str]) -> bool:
    """True when a valid Retry-After (any of its forms) is present; names must be lower-case."""
    return parse_retry_after(headers, now=0.0) is not None
