"""The configuration file's rules for routing's own fields, shared by ``loadconfig``'s schema
(``configfile/schema.py``) and the models' validation (``routing/models.py``)."""

from __future__ import annotations

from common.reader import Invalid
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
