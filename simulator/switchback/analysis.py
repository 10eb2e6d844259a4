"""Changes new/old − 1 per metric, with bootstrap confidence intervals over block pairs.

Each arm's value of a metric pools the arm's measured blocks: ratio metrics are ratios of sums
(e.g. mean TTFT = Σ TTFT ÷ Σ answers), so a busy block weighs more than a quiet one; the p50
TTFT is the mean of the blocks' medians. The confidence interval resamples *pairs* with
replacement (the unit of randomisation: within a pair the order of the routers was drawn) and
recomputes the change. A week has only 28 pairs and block metrics such as the 429 rate are
heavy-tailed, so plain percentile intervals are too narrow (A/A runs showed it). The interval
is therefore built on the log of new/old: the bootstrap standard error, corrected for the
small number of pairs (× √(n/(n−1))), times Student's t quantile with n − 1 degrees of
freedom, around the point estimate; then mapped back to a change. Where a ratio is not
positive (a zero rate) the percentile interval of the change is used instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

# metric → (numerator fields, denominator field); "p50" is the mean of block medians.
RATIOS: dict[str, tuple[tuple[str, ...], str]] = {
    "ttft_mean": (("ttft_sum",), "served"),
    "wait_mean": (("wait_sum",), "served"),
    "throughput": (("throughput_sum",), "served"),
    "rate_limit": (("provider_429",), "requests"),
    "broker_refusal": (("broker_refusals",), "requests"),
    "error": (("errors",), "requests"),
    "capacity_failure": (("capacity_failures",), "requests"),
    "cost": (("cost_sum",), "served"),
    # G1's unit: what the served answers cost per answer without a malformed tool call (G8) —
    # an agent must ask again after one, so a router that avoids them pays less per answer used.
    "cost_per_good": (("cost_sum",), "good_answers"),
    "served": (("served",), "requests"),
    "cache_hit": (("cached_input_tokens",), "input_tokens"),
    # C10: output tokens reserved beyond (over) and made beyond (unreserved) what the lease held
    # at the end, and the refused steps of streams in steps, per answer served.
    "over_reserved": (("over_reserved_tokens",), "served"),
    "unreserved": (("unreserved_tokens",), "served"),
    "steps_granted": (("steps_granted",), "served"),
    "steps_refused": (("steps_refused",), "served"),
}
# The changes reported, in the order of the report; the four first.
CHANGES = {
    "ttft_change": "ttft_p50",
    "throughput_change": "throughput",
    "rate_limit_change": "rate_limit",
    "cost_change": "cost",
    "cost_per_good_change": "cost_per_good",
    "ttft_mean_change": "ttft_mean",
    "wait_mean_change": "wait_mean",
    "error_change": "error",
    "broker_refusal_change": "broker_refusal",
    "capacity_failure_change": "capacity_failure",
    "served_change": "served",
    "over_reserved_change": "over_reserved",
}
BOOTSTRAP_RESAMPLES = 2000
FIELDS = sorted({f for num, den in RATIOS.values() for f in (*num, den)})


def arm_values(blocks: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Each metric's value over the given blocks' sums (None where undefined)."""
    totals = {f: float(sum(b[f] for b in blocks)) for f in FIELDS}
    values: dict[str, float | None] = {}
    for metric, (numerators, denominator) in RATIOS.items():
        den = totals[denominator]
        values[metric] = sum(totals[n] for n in numerators) / den if den > 0 else None
    medians = [b["ttft_p50"] for b in blocks if b.get("ttft_p50") is not None]
    values["ttft_p50"] = float(np.mean(medians)) if medians else None
    values["requests"] = totals["requests"]
    return values


def changes_estimate(
    pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], *, seed: int
) -> dict[str, Any]:
    """Point changes and bootstrap CIs for (new block, old block) stats of each pair."""
    new = arm_values([p[0] for p in pairs])
    old = arm_values([p[1] for p in pairs])
    out: dict[str, Any] = {}
    for name, metric in CHANGES.items():
        out[name] = _change(new[metric], old[metric])
    out["ci"] = _bootstrap(pairs, seed) if pairs else {name: None for name in CHANGES}
    out["new"] = new
    out["old"] = old
    out["pairs"] = len(pairs)
    return out


def _change(new: float | None, old: float | None) -> float | None:
    if new is None or old is None:
        return None
    if old == 0.0:
        return 0.0 if new == 0.0 else None
    return new / old - 1.0


def _bootstrap(
    pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], seed: int
) -> dict[str, list[float] | None]:
    n = len(pairs)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    arms = []
    for side in (0, 1):
        sums = {f: np.array([float(p[side][f]) for p in pairs])[picks].sum(axis=1) for f in FIELDS}
        med = np.array(
            [math.nan if p[side].get("ttft_p50") is None else p[side]["ttft_p50"] for p in pairs]
        )[picks]
        values: dict[str, np.ndarray] = {}
        with np.errstate(divide="ignore", invalid="ignore"):
            for metric, (numerators, denominator) in RATIOS.items():
                values[metric] = sum(sums[k] for k in numerators) / sums[denominator]
            values["ttft_p50"] = np.nanmean(med, axis=1) if not np.isnan(med).all() else med[:, 0]
        arms.append(values)
    point_new, point_old = arm_values([p[0] for p in pairs]), arm_values([p[1] for p in pairs])
    ci: dict[str, list[float] | None] = {}
    for name, metric in CHANGES.items():
        new, old = arms[0][metric], arms[1][metric]
        ci[name] = _interval(new, old, point_new[metric], point_old[metric], n)
    return ci


def _interval(
    new: np.ndarray, old: np.ndarray, point_new: float | None, point_old: float | None, n: int
) -> list[float] | None:
    valid = np.isfinite(new) & np.isfinite(old)
    if valid.sum() < BOOTSTRAP_RESAMPLES // 2 or point_new is None or point_old is None:
        return None
    new, old = new[valid], old[valid]
    if point_new > 0 and point_old > 0 and bool(np.all(new > 0)) and bool(np.all(old > 0)):
        logs = np.log(new / old)
        spread = float(np.std(logs, ddof=1)) * math.sqrt(n / max(1, n - 1))
        half = student_t_975(n - 1) * spread
        centre = math.log(point_new / point_old)
        return [math.exp(centre - half) - 1.0, math.exp(centre + half) - 1.0]
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.where(old == 0.0, np.where(new == 0.0, 0.0, np.nan), new / old - 1.0)
    change = change[np.isfinite(change)]
    if change.size < BOOTSTRAP_RESAMPLES // 2:
        return None
    lo, hi = np.quantile(change, [0.025, 0.975])
    return [float(lo), float(hi)]


def student_t_975(df: int) -> float:
    """Student's t 97.5 % quantile (Cornish–Fisher; within 1 % of exact from 3 df on)."""
    z = NormalDist().inv_cdf(0.975)
    if df <= 0:
        return math.inf
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )
