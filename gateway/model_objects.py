"""``/v1/models`` objects as OpenAI's SDKs parse them, with OpenRouter's fields added (issue 14):
``context_length``, ``pricing`` (USD per token, as decimal strings), ``supported_parameters``,
``top_provider``, and each endpoint with its own. Built from the snapshot: no database query.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from routing.catalogue import EndpointEntry, ModelEntry

# What every endpoint takes (gateway/validation.py), in OpenRouter's names; a capability an
# endpoint lists in ``supports`` adds its own.
BASE_PARAMETERS = ("max_tokens", "temperature", "top_p", "stop")
CAPABILITY_PARAMETERS = {
    "tools": ("tools", "tool_choice", "parallel_tool_calls"),
    "response_format": ("response_format", "structured_outputs"),
}
# What an endpoint that embeds takes (gateway/doors/embeddings.py), instead of the above.
EMBEDDINGS_PARAMETERS = ("dimensions", "encoding_format", "user")
PER_MILLION = Decimal(1_000_000)


def model_object(model: ModelEntry, name: str | None = None) -> dict[str, Any]:
    """The model under ``name``: its slug, or one of its aliases (then ``canonical_slug``, as
    OpenRouter calls it, says which model the alias stands for)."""
    endpoints = [endpoint_object(e) for e in model.endpoints]
    # The model's figures are those of the endpoint a price sort would pick (OpenRouter shows
    # one price per model), its context the largest any endpoint offers.
    cheapest = min(model.endpoints, key=lambda e: (e.price_input + e.price_output, e.key))
    widest = max(model.endpoints, key=lambda e: e.context_window)
    return {
        "id": name or model.slug,
        "object": "model",
        "created": model.created,
        "owned_by": "switchyard",
        "name": name or model.slug,
        "canonical_slug": model.slug,
        "aliases": list(model.aliases),
        "context_length": widest.context_window,
        "pricing": pricing(cheapest),
        "top_provider": {
            "context_length": widest.context_window,
            "max_completion_tokens": widest.max_output,
            "is_moderated": False,
        },
        "supported_parameters": sorted({p for e in endpoints for p in e["supported_parameters"]}),
        "endpoints": endpoints,
    }


def endpoint_object(endpoint: EndpointEntry) -> dict[str, Any]:
    return {
        "provider_name": endpoint.provider.name,
        "context_length": endpoint.context_window,
        "max_completion_tokens": endpoint.max_output,
        "pricing": pricing(endpoint),
        "supported_parameters": supported_parameters(endpoint.supports),
        "supports_streaming": "stream" in endpoint.supports,
    }


def pricing(endpoint: EndpointEntry) -> dict[str, str]:
    return {
        "prompt": per_token(endpoint.price_input),
        "completion": per_token(endpoint.price_output),
        "input_cache_read": per_token(endpoint.price_cached_input),
        "request": "0",
    }


def per_token(per_million: float) -> str:
    """USD per token as a plain decimal string (``0.5`` per million → ``"0.0000005"``)."""
    value = (Decimal(repr(per_million)) / PER_MILLION).normalize()
    return format(value, "f") if value else "0"


def supported_parameters(supports: frozenset[str]) -> list[str]:
    if "embeddings" in supports:  # it serves /v1/embeddings only
        return sorted(EMBEDDINGS_PARAMETERS)
    extra = [
        p for capability in sorted(supports) for p in CAPABILITY_PARAMETERS.get(capability, ())
    ]
    return sorted({*BASE_PARAMETERS, *extra})
