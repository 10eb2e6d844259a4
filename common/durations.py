"""Durations as the configuration file writes them: ``500ms``, ``10s``, ``1m``, ``5h``, ``1d``."""

from __future__ import annotations

import re

UNIT_SECONDS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def duration_parse(text: str) -> float | None:
    """Seconds for a duration string, or None when it is not one."""
    match = _DURATION.match(text)
    if match is None:
        return None
    return float(match.group(1)) * UNIT_SECONDS[match.group(2)]


def duration_format(seconds: float) -> str:
    """The shortest exact spelling of a duration: 60 → ``1m``, 90 → ``90s``, 0.5 → ``500ms``.

    Bucket names use it, so ``per: 60s`` and ``per: 1m`` name the same bucket.
    """
    for unit in ("d", "h", "m", "s"):
        count = seconds / UNIT_SECONDS[unit]
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}{unit}"
    millis = seconds * 1000
    if abs(millis - round(millis)) < 1e-6:
        return f"{round(millis)}ms"
    return f"{seconds:g}s"
