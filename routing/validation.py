"""The configuration file's rules for routing's own fields, shared by ``loadconfig``'s schema
(``configfile/schema.py``) and the models' validation (``routing/models.py``)."""

from __future__ import annotations

import re
from typing import Any

from common.reader import Invalid
from routing.core.contracts import contract_parse
from routing.core.parameters import RoutingParameters

# What an endpoint may declare it supports (``supports``); a request needing one goes only there.
# ``embeddings``: it serves ``/v1/embeddings`` (and only that).
CAPABILITIES = ("tools", "response_format", "stream", "embeddings")


def routing_overrides(value: object) -> dict[str, float]:
    """A model's routing parameters (routing/core/parameters.py) that differ from the defaults."""
    if not isinstance(value, dict):
        raise Invalid("must be a mapping of routing parameter names to values")
    try:
        RoutingParameters(**value)
    except TypeError as exc:
        known = ", ".join(sorted(RoutingParameters.__dataclass_fields__))
        raise Invalid(f"{exc} (known: {known})") from None
    for name, number in value.items():
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise Invalid(f"must be a number, got {number!r}", at=f".{name}")
    return dict(value)


REGION_TAG = r"[a-z0-9][a-z0-9._-]{0,39}"


def region(value: object) -> str:
    """An endpoint's data-residency tag (F5), e.g. ``eu`` or ``us-east``; "" for none."""
    if value == "":
        return ""
    if not isinstance(value, str) or not re.fullmatch(REGION_TAG, value):
        raise Invalid(
            "must be a region tag (lowercase letters, digits, '.', '_', '-'; at most 40), "
            f"got {value!r}"
        )
    return value


def batch_discount(value: object) -> float:
    """E5: the share a provider takes off its batch price, from 0 (none) to below 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise Invalid(f"must be a share from 0 to below 1 (0.5: half price), got {value!r}")
    return float(value)


def fallback_contract(value: object) -> dict[str, Any]:
    """A model's fallback contract (F5, routing/core/contracts.py) as configured."""
    try:
        contract_parse(value)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    if value is None:  # an emptied admin field: no contract
        return {}
    assert isinstance(value, dict)
    regions = value.get("regions")
    if isinstance(regions, list):
        for n, tag in enumerate(regions):
            try:
                region(tag)
            except Invalid as exc:
                raise Invalid(str(exc), at=f".regions[{n}]") from None
    return dict(value)
