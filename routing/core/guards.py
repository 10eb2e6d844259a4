"""Guards on top of the routing cost (SPEC G7, G8, G10): breaker, quality flag, backoff, cap, floor,
and the cost guard (issue 17) that bounds the expected price premium of the shares.

The cap is learned in ``stats`` (it changes with every 429 and answer); here it becomes a bound
on a share: an endpoint with cap κ (attempts/s) may take at most κ/R of a model whose endpoints
take R attempts/s together. ``fill`` then finds shares proportional to the weights within the
per-endpoint bounds [floor, cap], summing to 1: what a capped endpoint cannot take goes to the
others in proportion to their weights, and what the floors need comes from everyone above them.

The cost guard runs last, on the filled shares: with p_e endpoint e's effective price per good
answer and p* the cheapest eligible one's *that can take more traffic*, it keeps
Σ x_e·p_e ≤ (1 + max_cost_premium)·p*, moving the least share from the dearest endpoints to the
cheapest with room (floors and caps kept). The routing cost prices waiting at λ; the guard is the
user's own bound on what speed may cost. An endpoint that is full (its learned cap reached, or
the broker saying it has no room: ``planner._full``) is neither a place to move share to nor
the price to measure against: a bound over a price no mix can reach only sends requests to be
refused there and served elsewhere after the refusal (bench/markets/results.md, market (b)).

With no bound stated (the model's and the request's ``max_cost_premium`` both unset), the
default guards hold the mix to "no worse than price-only routing" on both counts: the speed
guard first (expected TTFT, then expected wait, ≤ price-only's mix's), then the cost guard with
price-only's price as a second bound (Σ x_e·p_e ≤ max((1 + 0.06)·p*, price-only's)).
Price-only's own mix meets both, so both can hold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from routing.core.parameters import RoutingParameters
from routing.core.stats import lower_median


def far_above_peers(values: list[float], ratio: float, margin: float) -> list[bool]:
    """For each value: is it above ``ratio`` × the others' (lower) median + ``margin``?

    The lower median: of two peers, the healthier. Their mean would let one peer's bad
    spell — a trickle with one fault in it — lift the bar for everyone else (G7, G11).
    """
    flags = []
    for i, value in enumerate(values):
        peers = values[:i] + values[i + 1 :]
        if not peers:
            flags.append(False)
            continue
        flags.append(value > ratio * lower_median(peers, 0.0) + margin)
    return flags


def breaker_open(
    fault_rates: list[float],
    params: RoutingParameters,
    *,
    probation: list[bool] | None = None,
    held_rates: list[float] | None = None,
) -> list[bool]:
    """G7: endpoints whose fault rate is far above their peers' get probe traffic only.

    An endpoint on ``probation`` (its breaker open, or closed only recently) is judged by its
    ``held_rates`` entry, the fault rate with a weak prior: it stays open until it recovers,
    not until the decayed evidence merely becomes too thin to reopen it.
    """
    opened = far_above_peers(fault_rates, params.breaker_ratio, params.breaker_margin)
    if probation is None or held_rates is None:
        return opened
    for i in range(len(fault_rates)):
        if opened[i] or not probation[i]:
            continue
        peers = fault_rates[:i] + fault_rates[i + 1 :]
        threshold = params.breaker_ratio * lower_median(peers, 0.0) + params.breaker_margin
        opened[i] = bool(peers) and held_rates[i] > threshold
    return opened


def half_open_share(since_closed: float, start: float, params: RoutingParameters) -> float:
    """G7 half-open: the most an endpoint whose breaker closed ``since_closed`` seconds ago may
    take. It grows from ``start`` to everything over a fast half-life (the breaker's probation),
    so an endpoint still failing meets a few trial requests before a failure reopens the breaker,
    not its old share of the traffic: that burst grows with the traffic, and at 35 % errors it
    was most of what an incident sent to the endpoint (tests/e2e/test_routing_incident.py)."""
    ramp = since_closed / params.fast_half_life_s
    if ramp >= 1.0:
        return 1.0
    return start + (1.0 - start) * max(ramp, 0.0)


def quality_flagged(bad_rates: list[float], params: RoutingParameters) -> list[bool]:
    """G8: endpoints whose bad-output rate is far above their peers' get probe traffic only."""
    return far_above_peers(bad_rates, params.quality_flag_ratio, params.quality_flag_margin)


def backoff_multiplier(
    recent_failure_rate: float, expected_failure_rate: float, params: RoutingParameters
) -> float:
    """G10 backoff: a weight multiplier that drops with recent faults and 429s, recovers in time.

    ``recent_failure_rate`` is the short-window fraction of failed attempts (its decayed sums
    fade with backoff_half_life_s, so the multiplier returns to 1 by itself).
    """
    excess = recent_failure_rate - expected_failure_rate - params.backoff_tolerance
    if excess <= 0.0:
        return 1.0
    return max(params.backoff_min, math.exp(-params.backoff_strength * excess))


def cap_share(cap_rps: float, model_rate: float) -> float:
    """The largest share an endpoint with this cap may take of the model's attempt rate."""
    if cap_rps <= 0.0 or model_rate <= 0.0:
        return 1.0
    return min(1.0, cap_rps / model_rate)


def fill(weights: list[float], lower: list[float], upper: list[float]) -> list[float]:
    """Shares x_i = clip(c·w_i, lower_i, upper_i) with Σx = 1 (lower ≤ upper assumed).

    If even the upper bounds add up to less than 1 (every endpoint at its cap) the excess is
    spread in proportion to the caps; if the lower bounds exceed 1 they are scaled down.
    """
    total_w = sum(weights)
    if total_w > 1e-200:
        c = 1.0 / total_w
        shares = [c * w for w in weights]
        if all(
            lo <= x <= hi for x, lo, hi in zip(shares, lower, upper, strict=True)
        ):  # the common case: no bound binds
            return shares
    # Weights relative to the largest; one below 1e-12 of it is none (the floor covers it), so
    # no breakpoint lo/w or hi/w can overflow.
    top = max(weights, default=0.0)
    weights = [w / top if w > 1e-12 * top else 0.0 for w in weights] if top > 0.0 else weights
    total_w = sum(weights)
    sum_lo, sum_hi = sum(lower), sum(upper)
    if sum_hi <= 1.0 or total_w <= 0.0:
        base = upper if sum_hi <= 1.0 else lower
        total = sum(base)
        if total <= 0.0:
            return [1.0 / len(weights)] * len(weights)
        return [b / total for b in base]
    if sum_lo >= 1.0:
        return [lo / sum_lo for lo in lower]
    reach = sum(hi if w > 0.0 else lo for w, lo, hi in zip(weights, lower, upper, strict=True))
    if reach < 1.0:  # weighted endpoints all capped: the rest goes where there is room
        room = sum(hi - lo for w, lo, hi in zip(weights, lower, upper, strict=True) if w <= 0.0)
        spare = (1.0 - reach) / room
        return [
            hi if w > 0.0 else lo + spare * (hi - lo)
            for w, lo, hi in zip(weights, lower, upper, strict=True)
        ]
    return _active_set(weights, lower, upper)


def _active_set(weights: list[float], lower: list[float], upper: list[float]) -> list[float]:
    # f(c) = Σ clip(c·w_i, lo_i, hi_i) rises with c; the solution c* has f(c*) = 1. At a trial c
    # (the free weights scaled to fill what is left), if clipping makes f(c) > 1 then c* < c, so
    # every endpoint below its floor at c stays below it at c*: fix those. If f(c) < 1, c* > c
    # and the endpoints above their cap stay above: fix those. Each round fixes at least one
    # endpoint; in practice one or two rounds.
    shares = list(lower)
    fixed = 0.0
    free = []
    for i, w in enumerate(weights):
        if w > 0.0:
            free.append(i)
        else:
            fixed += lower[i]
    c = 0.0
    while free:
        free_w = 0.0
        for i in free:
            free_w += weights[i]
        c = (1.0 - fixed) / free_w
        low, high, total = [], [], fixed
        for i in free:
            x = c * weights[i]
            if x < lower[i]:
                low.append(i)
                total += lower[i]
            elif x > upper[i]:
                high.append(i)
                total += upper[i]
            else:
                total += x
        if not low and not high:
            break
        if total > 1.0 + 1e-12 and low:
            settle, bound = low, lower
        elif total < 1.0 - 1e-12 and high:
            settle, bound = high, upper
        else:  # f(c) = 1 up to rounding: c is the answer for everyone
            for i in low:
                shares[i], fixed = lower[i], fixed + lower[i]
            for i in high:
                shares[i], fixed = upper[i], fixed + upper[i]
            settled = set(low) | set(high)
            free = [i for i in free if i not in settled]
            break
        for i in settle:
            shares[i] = bound[i]
            fixed += bound[i]
        settled = set(settle)
        free = [i for i in free if i not in settled]
    for i in free:
        shares[i] = c * weights[i]
    return shares


def price_premium(shares: list[float], prices: list[float], cheapest: float) -> float:
    """The traffic mix's expected price over ``cheapest``, less 1 (0.06 = 6 % dearer)."""
    if cheapest <= 0.0:
        return 0.0
    return mix_mean(shares, prices) / cheapest - 1.0


def cost_guard(
    shares: list[float],
    prices: list[float],
    lower: list[float],
    upper: list[float],
    max_premium: float,
    full: Sequence[bool] | None = None,
    baseline: float = 0.0,
) -> tuple[list[float], float, float]:
    """The cost guard (issue 17): shares whose expected price is at most (1 + max_premium) ×
    the cheapest eligible endpoint's that can take more traffic, or what the price-only router
    would pay for the same request if that is more, and the premium before and after (over p*):

        open_e = lower_e < upper_e and not full_e
        p*     = min { p_e : open_e }
        Σ x_e·p_e ≤ max((1 + max_premium)·p*, baseline)     x_e moved only toward open_e

    ``prices`` are effective prices per good answer (G3 price × attempts per good answer, G7/G8).
    ``baseline``: Σ s_e·p_e with s the price-only router's shares (``legacy``), at the same
    prices. Where price-only pays more than the premium allows (a market whose listed prices
    send it to a dear, fast endpoint), holding the router to p* would make it slower than the
    router it replaces for a saving nobody asked for; the bound is then price-only's own price,
    so switching the router on never costs more than either (bench/markets/results.md, (f)).
    Eligible: an endpoint that may take more than its floor (not behind a breaker or flag).
    ``full``: endpoints that can take no more traffic (``planner._full``: the learned cap
    reached, the broker's view of the endpoint); none given, none is. Such an endpoint keeps its
    share (it may give some up) but takes none, and its price is not p*: a cheap endpoint with
    no room would make the bound one no mix reaches. When no open endpoint is left the shares
    are returned as they are. The change is the least share moved (``_shift``; floors and caps
    are kept; where they leave no room the premium stays above the bound, as close to it as
    they allow). Shares already under the bound are returned as they are.
    """
    takes = _takes(lower, upper, full)
    cheapest = min((p for p, ok in zip(prices, takes, strict=True) if ok), default=0.0)
    before = price_premium(shares, prices, cheapest)
    if cheapest <= 0.0:
        return shares, before, before
    allowed = max(max_premium, baseline / cheapest - 1.0)
    if before <= allowed:
        return shares, before, before
    out = list(shares)
    _shift(out, prices, lower, upper, takes, (before - allowed) * cheapest)
    return out, before, price_premium(out, prices, cheapest)


def speed_guard(
    shares: list[float],
    waits: list[float],
    lower: list[float],
    upper: list[float],
    baseline: list[float],
    noise: list[float],
    z: float,
    full: Sequence[bool] | None = None,
) -> tuple[list[float], bool]:
    """Shares whose expected wait is no longer than the price-only router's, and whether any
    moved (issue 17):

        D  = Σ (x_e − s_e)·w_e                    s: price-only's shares (``baseline``)
        SE = √ Σ ((x_e − s_e)·w_e·ν_e)²           ν_e: w_e's relative standard error (``noise``)
        D > 0 and D > z·SE  →  Σ x_e·w_e ≤ Σ s_e·w_e     x_e moved only toward open_e

    ``waits``: the seconds the routing cost prices for an attempt, w_e = (1 + ttft_weight)·ttft_e
    + O/tps_e (G4, G5), or the TTFTs alone. λ says what a second is worth to the router; where
    the listed prices make the old router buy more speed than λ would (it ranks by the listed
    input price alone), the router still answers no slower than it: it moves the least share
    from the slowest endpoints to the fastest open ones. With ``z`` > 0 a gap within z standard
    errors of the estimates is left alone: between endpoints equally fast, the one that looks
    faster changes from one estimate to the next, and closing every such gap chases the noise
    toward price-only's favourite at the router's savings; a gap beyond it is closed whole, as
    a real one (``RoutingParameters.speed_guard_z``: what it keeps and what it gives up). The
    cost guard runs after and bounds what closing costs (``cost_guard``'s baseline is
    price-only's price, so the two can both hold: price-only's own mix meets both).
    """
    before, base = mix_mean(shares, waits), mix_mean(baseline, waits)
    if base <= 0.0 or before <= base * (1.0 + 1e-9):
        return shares, False
    if z > 0.0:
        variance = 0.0
        for x, s, w, nu in zip(shares, baseline, waits, noise, strict=True):
            variance += ((x - s) * w * nu) ** 2
        if (before - base) ** 2 <= z * z * variance:
            return shares, False
    out = list(shares)
    _shift(out, waits, lower, upper, _takes(lower, upper, full), before - base)
    return out, mix_mean(out, waits) < before


def _takes(lower: list[float], upper: list[float], full: Sequence[bool] | None) -> list[bool]:
    """Which endpoints may take more share: room under the cap and not full."""
    return [
        hi > lo and not (full is not None and full[i])
        for i, (lo, hi) in enumerate(zip(lower, upper, strict=True))
    ]


def mix_mean(shares: list[float], values: list[float]) -> float:
    """Σ x_e·v_e: the traffic mix's expected value (price, wait)."""
    total = 0.0
    for x, v in zip(shares, values, strict=True):
        total += x * v
    return total


def _shift(
    out: list[float],
    values: list[float],
    lower: list[float],
    upper: list[float],
    takes: list[bool],
    excess: float,
) -> None:
    """Lower Σ x_e·v_e by ``excess`` moving the least share, in place: each unit taken from the
    highest-valued endpoint above its floor and given to the lowest-valued one that takes
    (below its cap) lowers the sum the most, so the greedy pairing of the two ends moves the
    fewest requests."""
    n = len(out)
    donors = sorted(range(n), key=lambda i: -values[i])
    takers = sorted((i for i in range(n) if takes[i]), key=lambda i: values[i])
    d = t = 0
    while excess > 0.0 and d < len(donors) and t < len(takers):
        i, j = donors[d], takers[t]
        gap = values[i] - values[j]
        if gap <= 0.0:
            break
        room_i, room_j = out[i] - lower[i], upper[j] - out[j]
        need = excess / gap
        if room_i <= 0.0:
            d += 1
        elif room_j <= 0.0:
            t += 1
        elif need < min(room_i, room_j):
            out[i] -= need
            out[j] += need
            break
        elif room_i <= room_j:  # the donor reaches its floor
            out[i], out[j] = lower[i], out[j] + room_i
            excess -= room_i * gap
            d += 1
        else:  # the taker reaches its cap
            out[i], out[j] = out[i] - room_j, upper[j]
            excess -= room_j * gap
            t += 1
