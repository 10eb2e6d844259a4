"""Lognormal distributions fitted from a median and one tail quantile; the RNG is injected."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

_STANDARD_NORMAL = NormalDist()
Z95 = _STANDARD_NORMAL.inv_cdf(0.95)  # 1.6449: p95 = median · e^(σ·Z95), p05 = median · e^(−σ·Z95)


@dataclass(frozen=True)
class LogNormal:
    """``exp(N(mu, sigma²))``; ``sigma == 0`` is the constant ``exp(mu)``."""

    mu: float
    sigma: float

    @classmethod
    def from_median_p95(cls, median: float, p95: float) -> LogNormal:
        """Fitted so that the median and the 95th percentile are exactly the given ones."""
        if median <= 0 or p95 < median:
            raise ValueError(f"need 0 < median <= p95, got median={median}, p95={p95}")
        return cls(math.log(median), math.log(p95 / median) / Z95)

    @classmethod
    def from_median_p05(cls, median: float, p05: float) -> LogNormal:
        """Fitted so that the median and the 5th percentile are exactly the given ones."""
        if p05 <= 0 or p05 > median:
            raise ValueError(f"need 0 < p05 <= median, got median={median}, p05={p05}")
        return cls(math.log(median), math.log(median / p05) / Z95)

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    def quantile(self, q: float) -> float:
        """The value below which a share ``q`` (0 < q < 1) of draws fall."""
        return math.exp(self.mu + self.sigma * _STANDARD_NORMAL.inv_cdf(q))

    def sample(self, rng: random.Random) -> float:
        if self.sigma == 0:
            return math.exp(self.mu)
        return rng.lognormvariate(self.mu, self.sigma)
