"""Bounded jitter for wake-ups after a pause (F2): ``Retry-After`` is a floor, never earlier."""

from __future__ import annotations

import random


def jittered(until: float, *, spread: float, rng: random.Random) -> float:
    """A wake-up time in [until, until + spread], so waiters of one pause do not wake together."""
    if spread <= 0:
        return until
    return until + rng.uniform(0.0, spread)


def pause_spread(pause_seconds: float, *, fraction: float = 0.1, cap: float = 5.0) -> float:
    """Jitter width for a pause: a fraction of its length, at most ``cap`` seconds."""
    return max(0.0, min(cap, pause_seconds * fraction))
