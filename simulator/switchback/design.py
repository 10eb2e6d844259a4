"""The switchback design (SPEC G16): blocks, pairs, which router runs when, and segments.

Time is cut into blocks of ``experiment.block``; consecutive blocks form pairs, and each pair
runs the two routers in an order drawn under ``experiment.seed`` (new then old, or old then
new), balanced over the days and the time slots of a day (``Design.orders``), so neither
router gets the rising or the falling half of the day more often than the other. The first
``experiment.warmup`` of every block is discarded: state the other router left behind
(conversations pinned by it, learned caps, drained or full buckets) must wash out first.

Segments let a long run use several cores. Each segment simulates its own blocks, starting
earlier by a warm-up that rebuilds the market's state (token buckets, rolling spend windows,
learned router stats, daily counters — the warm-up reaches back to the last local midnight
when the segment does not start at one). Results depend on the number of segments, never on
how many processes run them.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

NEW, OLD = "routing_cost", "price_only"
DAY = 86400.0
SEGMENT_WARMUP_S = 6 * 3600.0


@dataclass(frozen=True)
class Design:
    block_s: float
    warmup_s: float
    duration_s: float
    seed: int
    arms: tuple[str, str] = (NEW, OLD)  # (treatment, baseline)

    @property
    def blocks(self) -> int:
        return int(self.duration_s // self.block_s)

    @property
    def pairs(self) -> int:
        return self.blocks // 2

    def orders(self) -> list[bool]:
        """For each pair: does the treatment (the new router) run first?

        Balanced under the seed when a day holds a whole number of pairs: every day runs the
        new router first in half of its pairs, and every time slot of the day (pair k of each
        day) in half of the days, give or take one. The second block of a pair often differs
        from the first for reasons of its own (the diurnal ramp, a daily quota running out at
        a given hour); with plain coin flips one router could get the better half of a slot on
        most days by chance. Which days and slots start with which router is still random.
        """
        rng = random.Random(f"switchback-order-{self.seed}")
        per_day = DAY / (2 * self.block_s)
        slots = round(per_day)
        if abs(per_day - slots) > 1e-9 or slots < 2 or self.pairs < 2 * slots:
            return [rng.random() < 0.5 for _ in range(self.pairs)]
        days = -(-self.pairs // slots)
        slot_rank, day_rank = list(range(slots)), list(range(days))
        rng.shuffle(slot_rank)
        rng.shuffle(day_rank)
        flip = rng.random() < 0.5
        return [
            ((day_rank[j // slots] + slot_rank[j % slots]) % 2 == 0) != flip
            for j in range(self.pairs)
        ]

    def arm_of(self, block: int, orders: list[bool]) -> int:
        """0 (treatment) or 1 (baseline) for a block; blocks past the last pair: baseline."""
        pair = block // 2
        if pair >= len(orders):
            return 1
        first = 0 if orders[pair] else 1
        return first if block % 2 == 0 else 1 - first


@dataclass(frozen=True)
class Segment:
    """Blocks ``[first_block, end_block)`` measured; simulated from ``start_s`` to ``end_s``."""

    index: int
    start_s: float
    first_block: int
    end_block: int
    end_s: float


def segments_plan(design: Design, count: int, warmup_s: float = SEGMENT_WARMUP_S) -> list[Segment]:
    """Cut the run at pair boundaries into ``count`` segments of balanced simulated length."""
    pair_s = 2 * design.block_s
    pairs = design.pairs
    count = max(1, min(count, pairs))
    if count == 1:
        return [Segment(0, 0.0, 0, design.blocks, design.blocks * design.block_s)]
    best: tuple[float, tuple[int, ...]] | None = None
    cuts: Iterable[tuple[int, ...]] = itertools.combinations(range(1, pairs), count - 1)
    if math.comb(pairs - 1, count - 1) > 20_000:  # many segments: even cuts are good enough
        cuts = [tuple(round(k * pairs / count) for k in range(1, count))]
    for cut in cuts:
        bounds = (0, *cut, pairs)
        load = max(
            bounds[k + 1] * pair_s - _warm_start(bounds[k] * pair_s, warmup_s) for k in range(count)
        )
        if best is None or load < best[0] - 1e-9:
            best = (load, bounds)
    assert best is not None
    bounds = best[1]
    segments = []
    for k in range(count):
        first, end = 2 * bounds[k], 2 * bounds[k + 1]
        last = k == count - 1
        segments.append(
            Segment(
                index=k,
                start_s=_warm_start(bounds[k] * pair_s, warmup_s),
                first_block=first,
                end_block=design.blocks if last else end,
                end_s=(design.blocks if last else end) * design.block_s,
            )
        )
    return segments


def _warm_start(split_s: float, warmup_s: float) -> float:
    if split_s <= 0.0:
        return 0.0
    midnight = math.floor(split_s / DAY) * DAY
    return max(0.0, min(split_s - warmup_s, midnight))
