"""Shadow prices of scarce shared capacity (issue 17): what serving a request at an endpoint
costs the requests it displaces there.

When a provider's pool is full, a unit of its scarce bucket (a rolling spend window, a slot, a
daily quota, a token bucket) that one request takes is a unit another request is refused. The
wait for capacity (``routing.core.capacity``) cannot see this: at the moment a request takes
the unit there *is* room. What the gateway can see are the broker's answers to its own fast
tries: per pool p, how many it granted and refused, which bucket b refused, and what the
refused request asked of b. From them (decayed sums, half-life H, a prior of n₀ tries):

    ρ_p      = refused_p / (tries_p + n₀)       share of fast tries at p the broker refused
    s_b      = named_b / Σ_b′ named_b′           how often b is the bucket that refused, of p's
                                                (a refusal while others wait in the queue
                                                names no bucket; it counts in ρ_p only)
    ū_b      = asked_b / named_b                 what a request refused at b asked of it
    u_b(r,e) = what r takes of b if served at e: 1 (requests), I, O or I + O (tokens),
               price_e(I, O) (spend, USD), wait_e(O) (concurrency: slot-seconds)
    d(r, e)  = ρ_p · Σ_b s_b · u_b(r,e) / ū_b    requests r displaces by being served at e

Every request served counts alike, so a displaced request is worth what this one's answer is.
In the plan (``planner``; routing-cost strategy only, price-only is the baseline):

    cost_e += d(r, e) · min_e′ cost_e′           the shadow price of what r uses at e
    d(r, e) > 1                                  e is left out of r's plan ("scarce"): it would
                                                 cost more answers than it gives; unless every
                                                 candidate is, then the least d stays

A chat-large answer at an endpoint whose spend window mostly refuses chat-small ones asks ten
times what they do, so there d passes 1 once one try in ten is refused, while a chat-small
request still goes. Nothing is known of a pool before its first refusal (d = 0), and as the
tries that would tell more fade (H) so does d: an endpoint left out is tried again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# The broker's refusals are the router's 429s in another form: they fade as fast (fast window).
HALF_LIFE_S = 30.0
# Pseudo-tries every pool starts with, as the 429 rate's prior (one refusal is no scarcity).
PRIOR_TRIES = 20.0


def ask(
    dimension: str,
    *,
    input_tokens: float,
    output_tokens: float,
    price: float,
    seconds: float,
) -> float:
    """u_b: what a request takes of a bucket of ``dimension`` (module docstring)."""
    if dimension == "requests":
        return 1.0
    if dimension == "input_tokens":
        return input_tokens
    if dimension == "output_tokens":
        return output_tokens
    if dimension == "total_tokens":
        return input_tokens + output_tokens
    if dimension == "spend":
        return price
    if dimension == "concurrency":
        return seconds
    return 0.0


class _Pool:
    __slots__ = ("at", "buckets", "refused", "tries")

    def __init__(self, now: float) -> None:
        self.tries = 0.0
        self.refused = 0.0
        self.at = now
        # bucket name → (dimension, times it refused, what those requests asked of it)
        self.buckets: dict[str, tuple[str, float, float]] = {}

    def decay(self, now: float) -> None:
        if now <= self.at:
            return
        f = math.exp(-(now - self.at) * math.log(2.0) / HALF_LIFE_S)
        self.tries *= f
        self.refused *= f
        self.buckets = {n: (d, k * f, a * f) for n, (d, k, a) in self.buckets.items()}
        self.at = now


class ScarcityView:
    """Per pool: the broker's grants and refusals to this process's fast tries; per endpoint,
    its pool. Pure: the clock is an argument."""

    __slots__ = ("_pools", "pool_of")

    def __init__(self) -> None:
        self._pools: dict[str, _Pool] = {}
        self.pool_of: dict[str, str] = {}  # endpoint id → pool

    def granted(self, endpoint_id: str, pool: str, now: float) -> None:
        """The broker granted a fast try at ``endpoint_id`` (its provider's pool ``pool``)."""
        self.pool_of[endpoint_id] = pool
        state = self._pools.get(pool)
        if state is None:
            return  # never refused: nothing to weigh a grant against
        state.decay(now)
        state.tries += 1.0

    def refused(
        self,
        endpoint_id: str,
        pool: str,
        now: float,
        buckets: Sequence[tuple[str, str, float]],
    ) -> None:
        """The broker refused a fast try for lack of capacity; ``buckets``: the refusing
        buckets as (name, dimension, what the request asked of it) — none when it was refused
        because others wait in the pool's queue."""
        self.pool_of[endpoint_id] = pool
        state = self._pools.get(pool)
        if state is None:
            state = self._pools[pool] = _Pool(now)
        state.decay(now)
        state.tries += 1.0
        state.refused += 1.0
        for name, dimension, asked in buckets:
            _, k, a = state.buckets.get(name, (dimension, 0.0, 0.0))
            state.buckets[name] = (dimension, k + 1.0, a + asked)

    @property
    def active(self) -> bool:
        """Some pool was refused (cheap test before pricing candidates)."""
        return bool(self._pools)

    def refused_share(self, endpoint_id: str, now: float) -> float:
        """ρ_p of ``endpoint_id``'s pool: the share of recent fast tries there the broker
        refused, whatever bucket refused them (a concurrency limit too); 0 when none was."""
        pool = self.pool_of.get(endpoint_id)
        state = self._pools.get(pool) if pool is not None else None
        if state is None:
            return 0.0
        f = 1.0
        if now > state.at:
            f = math.exp(-(now - state.at) * math.log(2.0) / HALF_LIFE_S)
        return state.refused * f / (state.tries * f + PRIOR_TRIES)

    def displaced(
        self,
        endpoint_id: str,
        now: float,
        *,
        input_tokens: float,
        output_tokens: float,
        price: float,
        seconds: float,
    ) -> float:
        """d(r, e): requests a request of these figures displaces if served at ``endpoint_id``
        (module docstring); 0 when nothing is known of its pool."""
        pool = self.pool_of.get(endpoint_id)
        state = self._pools.get(pool) if pool is not None else None
        if state is None or not state.buckets:
            return 0.0
        rho = self.refused_share(endpoint_id, now)
        named = sum(k for _, k, _ in state.buckets.values())
        total = 0.0
        for dimension, k, asked in state.buckets.values():
            if k <= 0.0 or asked <= 0.0:
                continue
            mine = ask(
                dimension,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                price=price,
                seconds=seconds,
            )
            total += (k / named) * mine / (asked / k)
        return rho * total


def scarcity_costs(costs: list[float], displaced: list[float]) -> tuple[list[float], list[int]]:
    """(cost_e + d_e · min cost, positions to keep: d_e ≤ 1, or the least d_e when none is)."""
    best = min(costs)
    priced = [c + d * best for c, d in zip(costs, displaced, strict=True)]
    keep = [k for k, d in enumerate(displaced) if d <= 1.0]
    if not keep:
        keep = [min(range(len(displaced)), key=lambda k: displaced[k])]
    return priced, keep
