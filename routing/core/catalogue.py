"""Static figures of models and endpoints as the router sees them (a snapshot of the admin)."""

from __future__ import annotations

from dataclasses import dataclass, field

from routing.core.contracts import OPEN, FallbackContract
from routing.core.parameters import RoutingParameters

PER_MILLION = 1e-6
# The cost guard's bound where neither the model nor the request states one (issue 17).
DEFAULT_MAX_COST_PREMIUM = 0.06


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """One provider serving one model. Prices are USD per million tokens, as configured."""

    id: str  # unique, e.g. "acme/chat-large@alpha"
    provider: str  # provider slug, matched by provider.order / only / ignore
    model: str
    price_input: float
    price_cached_input: float
    price_output: float
    context_window: int
    max_output: int
    supports: frozenset[str] = frozenset()
    cache_ttl_s: float = 300.0  # G12: provider prompt-cache lifetime since last use
    flagged: bool = False  # G8: quality flag set by an admin or a benchmark job
    active: bool = True
    region: str = ""  # F5: data-residency tag a fallback contract may constrain ("": none)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A public model id with its endpoints and routing parameters."""

    slug: str
    endpoints: tuple[EndpointConfig, ...]
    params: RoutingParameters = field(default_factory=RoutingParameters)
    default_output_tokens: float = 400.0  # C2: output estimate before any traffic was seen
    default_input_tokens: float | None = None  # None: params.default_input_tokens
    # The cost guard (issue 17): the traffic mix's expected price at most this much above the
    # cheapest eligible endpoint's (0.06 = +6 %); a request's provider.max_cost_premium wins.
    # None: the default guards (DEFAULT_MAX_COST_PREMIUM, and no worse than price-only).
    max_cost_premium: float | None = None
    # F5: what a fallback attempt may differ in from the first choice (the default: anything).
    contract: FallbackContract = OPEN
