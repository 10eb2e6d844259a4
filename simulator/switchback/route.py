"""One endpoint as the simulated gateway (``gateway.py``) dispatches to it: what the broker
(``admission.py``), the traffic and the market builder (``market.py``) know of a route."""

from __future__ import annotations

from dataclasses import dataclass

from quotas.core.model import BucketSpec
from routing.core import EndpointConfig
from simulator.model import ProviderBehaviour


@dataclass(frozen=True, slots=True)
class Route:
    """One endpoint as the simulated gateway dispatches to it."""

    endpoint: EndpointConfig
    behaviour: ProviderBehaviour
    upstream: str
    buckets: tuple[BucketSpec, ...]
    scope: str  # the provider's scope: paused after its 429s

    def cost(self, input_tokens: int, cached: int, output_tokens: int) -> float:
        e = self.endpoint
        uncached = input_tokens - cached
        return (
            uncached * e.price_input
            + cached * e.price_cached_input
            + output_tokens * e.price_output
        ) * 1e-6
