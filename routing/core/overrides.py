"""Request overrides (SPEC G13): OpenRouter's ``provider`` object and the model suffixes.

Field meanings follow OpenRouter (research/features.md §1.1–1.3): ``order`` bypasses the
algorithm; ``only`` / ``ignore`` filter and the algorithm chooses among the rest; ``sort`` uses
that sort instead; ``max_price`` excludes endpoints listing a higher price (USD per million
tokens); ``require_parameters`` keeps only endpoints supporting every feature of the request;
``preferred_min_throughput`` / ``preferred_max_latency`` deprioritise (never exclude).
``max_cost_premium`` (ours, not OpenRouter's) replaces the model's cost guard bound for the
request: the expected price of the routing-cost shares at most this fraction above the cheapest
eligible endpoint's (0 = the cheapest's price; 0.06 = +6 %).
Fields we do not act on (``data_collection``, ``zdr``, ``quantizations``, …) are accepted and
ignored so OpenRouter clients keep working.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SORTS = ("price", "throughput", "latency")
SUFFIX_SORTS = {"floor": "price", "nitro": "throughput"}


@dataclass(frozen=True, slots=True)
class ProviderPreferences:
    """The parsed ``provider`` object of a request."""

    order: tuple[str, ...] = ()
    allow_fallbacks: bool = True
    only: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    sort: str | None = None
    sort_partition: str = "model"  # "none": sort the endpoints of all listed models together
    max_price_prompt: float | None = None  # USD per million input tokens
    max_price_completion: float | None = None  # USD per million output tokens
    require_parameters: bool = False
    preferred_min_throughput: float | None = None  # output tokens/s (p50)
    preferred_max_latency: float | None = None  # seconds to first token (p50)
    max_cost_premium: float | None = None  # None: the model's bound (cost guard)


def _slugs(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"provider.{name} must be a list of provider names")
    return tuple(value)


def _number(value: Any, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"provider.{name} must be a non-negative number")
    return float(value)


def _percentile(value: Any, name: str) -> float | None:
    # OpenRouter accepts a number (the p50) or {p50, p75, p90, p99}; we measure means, so only
    # the p50 (or, failing that, the loosest percentile given) is compared with our estimate.
    if value is None:
        return None
    if isinstance(value, Mapping):
        for key in ("p50", "p75", "p90", "p99"):
            if value.get(key) is not None:
                return _number(value[key], f"{name}.{key}")
        raise ValueError(f"provider.{name} needs one of p50, p75, p90, p99")
    return _number(value, name)


def provider_preferences_parse(obj: Mapping[str, Any] | None) -> ProviderPreferences:
    """Validate a request's ``provider`` object; raises ValueError with a client-safe message."""
    if obj is None:
        return ProviderPreferences()
    if not isinstance(obj, Mapping):
        raise ValueError("provider must be an object")
    order = _slugs(obj["order"], "order") if obj.get("order") is not None else ()
    only = _slugs(obj["only"], "only") if obj.get("only") is not None else None
    ignore = _slugs(obj["ignore"], "ignore") if obj.get("ignore") is not None else ()
    allow_fallbacks = obj.get("allow_fallbacks", True)
    require_parameters = obj.get("require_parameters", False)
    if not isinstance(allow_fallbacks, bool) or not isinstance(require_parameters, bool):
        raise ValueError("provider.allow_fallbacks and require_parameters must be booleans")
    sort: Any = obj.get("sort")
    partition: Any = "model"
    if isinstance(sort, Mapping):
        sort, partition = sort.get("by"), sort.get("partition", "model")
        if partition not in ("model", "none"):
            raise ValueError('provider.sort.partition must be "model" or "none"')
    if sort is not None and sort not in SORTS:
        raise ValueError('provider.sort must be "price", "throughput" or "latency"')
    max_price = obj.get("max_price") or {}
    if not isinstance(max_price, Mapping):
        raise ValueError("provider.max_price must be an object")
    prompt, completion = max_price.get("prompt"), max_price.get("completion")
    premium = obj.get("max_cost_premium")
    return ProviderPreferences(
        order=order,
        allow_fallbacks=allow_fallbacks,
        only=only,
        ignore=ignore,
        sort=sort,
        sort_partition=partition,
        max_price_prompt=None if prompt is None else _number(prompt, "max_price.prompt"),
        max_price_completion=(
            None if completion is None else _number(completion, "max_price.completion")
        ),
        require_parameters=require_parameters,
        preferred_min_throughput=_percentile(
            obj.get("preferred_min_throughput"), "preferred_min_throughput"
        ),
        preferred_max_latency=_percentile(
            obj.get("preferred_max_latency"), "preferred_max_latency"
        ),
        max_cost_premium=None if premium is None else _number(premium, "max_cost_premium"),
    )


def model_suffix_split(slug: str) -> tuple[str, str | None]:
    """``acme/m:floor`` → (``acme/m``, ``price``); ``:nitro`` → throughput; else (slug, None)."""
    base, sep, suffix = slug.rpartition(":")
    if sep and suffix in SUFFIX_SORTS:
        return base, SUFFIX_SORTS[suffix]
    return slug, None


def strategy_choose(
    prefs: ProviderPreferences, suffix_sort: str | None, tenant_sort: str | None, default: str
) -> str:
    """G13 precedence: provider.order > provider.sort > model suffix > tenant default > model."""
    if prefs.order:
        return "order"
    return prefs.sort or suffix_sort or tenant_sort or default
