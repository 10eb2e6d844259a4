"""Cache-aware stickiness (SPEC G12): keep a conversation where its prompt cache is warm.

Only a conversation's first request is routed by the algorithm; later ones stay on the pinned
endpoint while its cache is warm (provider TTL since last use) and the endpoint is available —
and, one step beyond "always stick", only while staying is worth it: the pinned endpoint's
routing-cost gap to the best must not exceed the expected saving from its warm cache,
``prefix tokens × (p_in − p_cached) × P(hit)``. The guards hold for sticky traffic too: an
endpoint over its cap or in backoff keeps a conversation only with the probability its
multiplier and cap allow, so a pinned crowd cannot overrun it. Stickiness belongs to the
default routing (routing cost, or the price-only baseline with plain "stick while warm"); a
request with an explicit ``provider.order`` or sort gets what it asked for.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from routing.core.catalogue import PER_MILLION, EndpointConfig


@dataclass(frozen=True, slots=True)
class StickyState:
    """Where a conversation was last served: the gateway stores it under ``conversation_key``."""

    endpoint_id: str
    last_used: float  # time of the last request served there (same clock as ``now``)
    prefix_tokens: float  # tokens of the conversation a warm cache would hold (last in + out)


def conversation_key(
    *,
    tenant: str,
    model: str,
    session_id: str | None = None,
    user: str | None = None,
    messages: Sequence[Mapping[str, Any]] = (),
    leading: int = 2,
) -> str | None:
    """A conversation's key: session id, else ``user``, else a hash of the leading messages."""
    if session_id:
        basis = "s:" + session_id
    elif user:
        basis = "u:" + user
    elif messages:
        head = json.dumps(list(messages[:leading]), sort_keys=True, separators=(",", ":"))
        basis = "m:" + head
    else:
        return None
    digest = hashlib.blake2b(basis.encode(), digest_size=16).hexdigest()
    return f"{tenant}:{model}:{digest}"


def expected_cache_saving(
    endpoint: EndpointConfig, *, prefix_tokens: float, hit_probability: float
) -> float:
    """USD a warm cache is expected to save on the next request of the conversation."""
    discount = max(0.0, endpoint.price_input - endpoint.price_cached_input) * PER_MILLION
    return prefix_tokens * discount * hit_probability


def sticky_keeps(*, pinned_cost: float, best_cost: float, expected_saving: float) -> bool:
    """Stay iff the pinned endpoint's routing-cost gap to the best is at most the saving."""
    return pinned_cost - best_cost <= expected_saving


def sticky_decide(
    state: StickyState,
    endpoint: EndpointConfig | None,
    *,
    now: float,
    available: bool,
    keep_probability: float,
    pinned_cost: float,
    best_cost: float,
    hit_probability: float,
    rng: random.Random,
    compare_cost: bool = True,
) -> tuple[bool, str]:
    """(stay, reason): reasons are warm, cold, unavailable, guard, cost_gap.

    ``endpoint`` is None when the pinned endpoint is no candidate for this request (filtered,
    inactive, too small a context). ``keep_probability`` is backoff × min(1, cap/load).
    ``compare_cost`` False gives the plain "always stick while warm" rule.
    """
    if endpoint is None:
        return False, "unavailable"
    if now - state.last_used > endpoint.cache_ttl_s:
        return False, "cold"
    if not available:
        return False, "unavailable"
    if keep_probability < 1.0 and rng.random() >= keep_probability:
        return False, "guard"
    if compare_cost:
        saving = expected_cache_saving(
            endpoint, prefix_tokens=state.prefix_tokens, hit_probability=hit_probability
        )
        if not sticky_keeps(pinned_cost=pinned_cost, best_cost=best_cost, expected_saving=saving):
            return False, "cost_gap"
    return True, "warm"
