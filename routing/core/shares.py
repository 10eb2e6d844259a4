"""Traffic shares (SPEC G9) and the weighted random attempt order (G14).

Inside the competitive band (cost ≤ (1 + γ)·best) an endpoint's weight is
``exp(−(cost/best − 1)/β)``: a small gap costs a small share. Beyond the band the weight keeps
falling with the much smaller scale β_out, continuously at the band edge, so it soon reaches the
floor. Weights are then multiplied by the backoff and bounded by floor and cap (``guards.fill``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from routing.core.parameters import RoutingParameters


def band_weight(ratio: float, params: RoutingParameters) -> float:
    """Weight of an endpoint whose cost is ``ratio`` × the best cost (ratio ≥ 1)."""
    gap = ratio - 1.0
    if gap <= params.band:
        return math.exp(-gap / params.beta)
    return math.exp(-params.band / params.beta - (gap - params.band) / params.beta_outside)


def band_weights(
    costs: Sequence[float], multipliers: Sequence[float], params: RoutingParameters
) -> list[float]:
    """Band weight × backoff multiplier for each cost; a zero multiplier means no weight."""
    best = math.inf
    for cost, m in zip(costs, multipliers, strict=True):
        if m > 0.0 and cost < best:
            best = cost
    if best == math.inf or best <= 0.0:
        return [m for m in multipliers]
    inv_best, beta, band = 1.0 / best, params.beta, params.band
    edge = math.exp(-band / beta)
    beta_out = params.beta_outside
    weights = []
    for cost, m in zip(costs, multipliers, strict=True):
        if m <= 0.0:
            weights.append(0.0)
            continue
        gap = cost * inv_best - 1.0
        if gap <= band:
            weights.append(m * math.exp(-gap / beta))
        else:
            weights.append(m * edge * math.exp(-(gap - band) / beta_out))
    return weights


def weighted_order(shares: Sequence[float], rng: random.Random) -> list[int]:
    """Indices in the order of successive weighted draws without replacement.

    Each index gets an exponential clock of rate share_i; the first to ring is index i with
    probability share_i / Σshare and, by memorylessness, the rest follow the same rule over the
    remaining indices — one random number per endpoint instead of one pass per draw.
    """
    rand = rng.random
    keys = []
    for i, share in enumerate(shares):
        if share > 0.0:
            keys.append((-math.log(1.0 - rand()) / share, i))
        else:
            keys.append((math.inf, i))
    keys.sort()
    return [i for _, i in keys]
