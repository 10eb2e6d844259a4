"""Fallback contracts (SPEC F5): what a fallback may differ in from the first choice.

A route (a model) states which differences its workload tolerates when an attempt after the
first choice goes to another endpoint — another provider, or a fallback model: the providers it
may go to, data residency (region tags), a price ceiling relative to the first choice, the
context window, and tool / response-format support. The planner never plans a fallback outside
the contract, and a refusal names the clause that stopped it (``contract_breach``).

Latency is compared as a price is: this request's expected seconds at the fallback (G4's wait,
TTFT plus its output at the endpoint's measured speed) over those at the first choice, so an
interactive route can say a fallback may be at most, say, 1.5 times slower.

A workload class may state a contract too (a batch class held to cheaper fallbacks, an
interactive one that must stay in the region): it narrows its route's, clause by clause
(``contract_narrow``), so a route's promise holds whatever class a request comes in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

SAME = "same"
ANY = "any"
SAME_OR_LARGER = "same_or_larger"
# The features whose support a fallback may have to share with the first choice.
CONTRACT_FEATURES = ("tools", "response_format")
FIELDS = ("providers", "regions", "max_price_ratio", "max_latency_ratio", "context", "features")


@dataclass(frozen=True, slots=True)
class FallbackContract:
    """What a fallback attempt may differ in. The default contract allows any difference."""

    providers: frozenset[str] | None = None  # None: any provider serving the model
    same_region: bool = False  # the first choice's region tag, exactly
    regions: frozenset[str] | None = None  # None: any region tag
    max_price_ratio: float | None = None  # fallback's effective price / first choice's
    max_latency_ratio: float | None = None  # fallback's expected seconds / first choice's
    context_same_or_larger: bool = False
    features_same: bool = False  # every tools / response_format support the first choice has

    @property
    def open(self) -> bool:
        return self == OPEN


OPEN = FallbackContract()


class Endpoint(Protocol):
    """What a contract reads of an endpoint (``routing.core.catalogue.EndpointConfig``, which
    holds the model's contract and so is not imported here)."""

    @property
    def provider(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def context_window(self) -> int: ...
    @property
    def supports(self) -> frozenset[str]: ...


def contract_breach(
    contract: FallbackContract,
    first: Endpoint,
    first_price: float,
    candidate: Endpoint,
    candidate_price: float,
    *,
    first_wait: float = 0.0,
    candidate_wait: float = 0.0,
) -> str | None:
    """The clause of ``contract`` that stops ``candidate`` as a fallback of ``first``, or None.

    Prices are the request's effective price (USD) at each endpoint, waits its expected
    seconds there; the clause is written for people and for an ASCII header, e.g.
    ``region eu != us``."""
    if contract.providers is not None and candidate.provider not in contract.providers:
        return f"provider {candidate.provider} not in [{', '.join(sorted(contract.providers))}]"
    if contract.same_region and candidate.region != first.region:
        return f"region {_tag(candidate.region)} != {_tag(first.region)}"
    if contract.regions is not None and candidate.region not in contract.regions:
        allowed = ", ".join(sorted(_tag(r) for r in contract.regions))
        return f"region {_tag(candidate.region)} not in [{allowed}]"
    ratio = contract.max_price_ratio
    if ratio is not None and candidate_price > first_price * ratio * (1.0 + 1e-9):
        actual = candidate_price / first_price if first_price > 0.0 else float("inf")
        return f"price ratio {actual:.3g} > {ratio:g}"
    ratio = contract.max_latency_ratio
    if ratio is not None and candidate_wait > first_wait * ratio * (1.0 + 1e-9):
        actual = candidate_wait / first_wait if first_wait > 0.0 else float("inf")
        return f"latency ratio {actual:.3g} > {ratio:g}"
    if contract.context_same_or_larger and candidate.context_window < first.context_window:
        return f"context window {candidate.context_window} < {first.context_window}"
    if contract.features_same:
        for feature in CONTRACT_FEATURES:
            if feature in first.supports and feature not in candidate.supports:
                return f"feature {feature} unsupported (the first choice supports it)"
    return None


def contract_narrow(route: FallbackContract, workload: FallbackContract | None) -> FallbackContract:
    """The contract a request keeps to: its route's, narrowed by its workload class's (F5).

    A class can only narrow what its route allows, never widen it: each clause is the
    stricter of the two (providers and regions both listed: those in both; two ceilings: the
    lower; a "same" clause in either: same)."""
    if workload is None or workload.open:
        return route
    if route.open:
        return workload
    return FallbackContract(
        providers=_both(route.providers, workload.providers),
        same_region=route.same_region or workload.same_region,
        regions=_both(route.regions, workload.regions),
        max_price_ratio=_lower(route.max_price_ratio, workload.max_price_ratio),
        max_latency_ratio=_lower(route.max_latency_ratio, workload.max_latency_ratio),
        context_same_or_larger=route.context_same_or_larger or workload.context_same_or_larger,
        features_same=route.features_same or workload.features_same,
    )


def _both(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    if a is None:
        return b
    return a if b is None else a & b


def _lower(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def contract_refusal(model: str, endpoint_id: str, clause: str) -> str:
    """The sentence a refusal carries, e.g. for the gateway's error message."""
    return f"Fallback to '{endpoint_id}' not allowed by the route's contract ({model}): {clause}"


def _tag(region: str) -> str:
    return region or '""'


def contract_parse(value: Any) -> FallbackContract:
    """A contract from its configured form (the config file's ``fallback_contract`` mapping,
    the admin's JSON); ValueError names the field at fault."""
    if value is None:
        return OPEN
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of contract clauses (" + ", ".join(FIELDS) + ")")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown clause {unknown[0]!r} (known: {', '.join(FIELDS)})")
    providers = value.get("providers")
    if providers is not None:
        providers = frozenset(_names(providers, "providers"))
    same_region, regions = False, None
    given = value.get("regions")
    if given == SAME:
        same_region = True
    elif given is not None:
        if not isinstance(given, list):
            raise ValueError(f"regions: must be 'same' or a list of region tags, got {given!r}")
        regions = frozenset(_names(given, "regions", allow_empty_tag=True))
    ratio = _ratio(value, "max_price_ratio")
    latency_ratio = _ratio(value, "max_latency_ratio")
    context = value.get("context", ANY)
    if context not in (ANY, SAME_OR_LARGER):
        raise ValueError(f"context: must be one of any, same_or_larger, got {context!r}")
    features = value.get("features", ANY)
    if features not in (ANY, SAME):
        raise ValueError(f"features: must be one of any, same, got {features!r}")
    return FallbackContract(
        providers=providers,
        same_region=same_region,
        regions=regions,
        max_price_ratio=ratio,
        max_latency_ratio=latency_ratio,
        context_same_or_larger=context == SAME_OR_LARGER,
        features_same=features == SAME,
    )


def _ratio(value: dict[str, Any], field: str) -> float | None:
    ratio = value.get(field)
    if ratio is None:
        return None
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio >= 1.0:
        raise ValueError(f"{field}: must be a number >= 1 (1.5 = +50 %), got {ratio!r}")
    return float(ratio)


def _names(value: Any, field: str, *, allow_empty_tag: bool = False) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{field}: must be a non-empty list, got {value!r}")
    for name in value:
        if not isinstance(name, str) or (not name and not allow_empty_tag):
            raise ValueError(f"{field}: every item must be a non-empty string, got {name!r}")
    return list(value)
