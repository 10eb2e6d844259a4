"""Durations as the market file writes them: ``500ms``, ``10s``, ``40m``, ``30h``, ``7d``."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")


def parse_duration(text: str) -> float:
    """Seconds in a duration string; raises ValueError on anything but number+unit parts."""
    cleaned = text.strip()
    if not _WHOLE.fullmatch(cleaned):
        raise ValueError(
            f"{text!r} is not a duration: use a number with a unit ms, s, m, h or d (e.g. '40m')"
        )
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(cleaned))
