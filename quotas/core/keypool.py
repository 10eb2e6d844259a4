"""Key pools (SPEC B2): which of a provider organisation's API keys a request is sent with.

Pure: no Redis, time is a parameter. The broker keeps one ``KeyPool`` per process. What it
knows of each key comes from its own answers — the share of the key's own buckets left after
the last grant, a refusal by one of them (full until then), and a 401/403 from the provider
(out of the pool for a while) — so choosing costs nothing on the hot path.

The order is a weighted shuffle, not first-fit: each key's weight is the room it had left
when last seen (regrowing towards full as time passes), so a burst spreads over every key in
proportion to its room instead of draining the first one and then moving on. Keys out of the
pool come only when none is left: the provider then answers as it would without a pool.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

# A key seen with no room left still gets this weight: the view is old by the time it is read.
MIN_WEIGHT = 0.02
# Seconds over which a key's last-seen room is forgotten (regrows to full): what it had left a
# while ago says little of what it has now.
ROOM_MEMORY_SECONDS = 10.0
# A key the provider refused (401, 403) is out of the pool this long, then one request may
# try it again (a key restored by the provider's admins comes back on its own).
OUT_SECONDS = 300.0


@dataclass
class KeyState:
    room: float = 1.0  # share of the key's tightest own bucket left at ``seen_at`` (0–1)
    seen_at: float = float("-inf")
    full_until: float = 0.0  # refused by one of its own buckets: no room before this
    out_until: float = 0.0  # refused by the provider (401/403): out of the pool until this
    why: str = ""  # the last refusal's words, for operators


class KeyPool:
    """This process's view of every pooled key's room and health."""

    def __init__(self) -> None:
        self._keys: dict[Hashable, KeyState] = {}

    def state(self, key: Hashable) -> KeyState:
        return self._keys.setdefault(key, KeyState())

    def weight(self, key: Hashable, now: float) -> float:
        """How much room ``key`` is believed to have at ``now`` (``MIN_WEIGHT``–1)."""
        s = self._keys.get(key)
        if s is None:
            return 1.0
        if s.full_until > now:
            return MIN_WEIGHT
        age = max(0.0, now - s.seen_at)
        room = s.room + (1.0 - s.room) * min(1.0, age / ROOM_MEMORY_SECONDS)
        return max(MIN_WEIGHT, min(1.0, room))

    def healthy(self, key: Hashable, now: float) -> bool:
        s = self._keys.get(key)
        return s is None or s.out_until <= now

    def order(self, keys: Sequence[K], now: float, rng: random.Random) -> list[K]:
        """The keys to try, best first: the healthy ones in a room-weighted shuffle; the ones
        out of the pool only when no healthy one is left (soonest back first)."""
        healthy = [k for k in keys if self.healthy(k, now)]
        if not healthy:
            return sorted(keys, key=lambda k: self.state(k).out_until)
        # Efraimidis–Spirakis: sorting by u^(1/w) draws without replacement by weight.
        drawn = [(rng.random() ** (1.0 / self.weight(k, now)), i) for i, k in enumerate(healthy)]
        return [healthy[i] for _, i in sorted(drawn, reverse=True)]

    def granted(self, key: Hashable, room: float | None, now: float) -> None:
        """A reservation on ``key`` was granted, leaving ``room`` (None: it has no buckets)."""
        s = self.state(key)
        s.full_until = 0.0
        if room is not None:
            s.room, s.seen_at = max(0.0, min(1.0, room)), now

    def full(self, key: Hashable, until: float, now: float) -> None:
        """One of ``key``'s own buckets refused until ``until``."""
        s = self.state(key)
        s.full_until, s.room, s.seen_at = until, 0.0, now

    def failed(self, key: Hashable, now: float, why: str, seconds: float = OUT_SECONDS) -> None:
        """The provider refused ``key`` itself (401, 403): out of the pool for ``seconds``."""
        s = self.state(key)
        s.out_until, s.why = now + seconds, why

    def usable(self, keys: Sequence[Hashable], now: float) -> int:
        """How many of ``keys`` are in the pool at ``now``."""
        return sum(1 for k in keys if self.healthy(k, now))


def room_left(parts: Sequence[tuple[float | None, float]]) -> float | None:
    """The share left of the tightest bucket among ``(remaining, capacity)`` pairs; None when
    none reports a level (no buckets of the key's own)."""
    shares = [r / c for r, c in parts if r is not None and c > 0]
    return min(shares) if shares else None
