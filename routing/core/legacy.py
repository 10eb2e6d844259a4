"""The price-only router (the old behaviour; the baseline of the G16 switchback experiment).

Among endpoints without a significant failure in the last 30 s (``ModelTable.legacy_outage``),
shares go by the inverse square of the listed input price; the first attempt is a weighted
pick, and a failure goes to the next cheapest by listed input price. If every endpoint is in an
outage, all of them are used. Stickiness under this router is the plain "always stick while warm".
"""

from __future__ import annotations

import random
from collections.abc import Sequence

# An endpoint listing a zero input price would take every request: treat it as 1 µ$/Mtok.
MIN_PRICE = 1e-6


def price_only_shares(prices_input: Sequence[float], outage: Sequence[bool]) -> list[float]:
    """Shares ∝ 1/price² among endpoints not in an outage (all of them if every one is)."""
    usable = [not o for o in outage]
    if not any(usable):
        usable = [True] * len(outage)
    weights = [
        1.0 / max(price, MIN_PRICE) ** 2 if ok else 0.0
        for price, ok in zip(prices_input, usable, strict=True)
    ]
    total = sum(weights)
    return [w / total for w in weights]


def price_only_order(
    prices_input: Sequence[float], outage: Sequence[bool], rng: random.Random
) -> list[int]:
    """Indices to try: a weighted pick first, then the rest cheapest listed input price first."""
    shares = price_only_shares(prices_input, outage)
    draw, acc, first = rng.random(), 0.0, -1
    for i, share in enumerate(shares):
        acc += share
        if share > 0.0 and draw < acc:
            first = i
            break
    if first < 0:  # float rounding left the draw just above the last cumulative sum
        first = max(range(len(shares)), key=shares.__getitem__)
    rest = sorted((i for i in range(len(shares)) if i != first), key=prices_input.__getitem__)
    # Endpoints in an outage are tried only after the stable ones.
    rest.sort(key=outage.__getitem__)
    return [first, *rest]
