"""Provider adapters: one per wire protocol, looked up by the provider's ``protocol``."""

from __future__ import annotations

from types import MappingProxyType

from gateway.providers.anthropic import AnthropicAdapter
from gateway.providers.base import Adapter
from gateway.providers.openai import OpenAIAdapter

# Adapters hold no state, so one instance per protocol serves every request.
_ADAPTERS: MappingProxyType[str, Adapter] = MappingProxyType(
    {"openai": OpenAIAdapter(), "anthropic": AnthropicAdapter()}
)

PROTOCOLS: tuple[str, ...] = tuple(_ADAPTERS)


def adapter_for(protocol: str) -> Adapter:
    """The adapter for a provider's wire protocol; ValueError for an unknown one."""
    try:
        return _ADAPTERS[protocol]
    except KeyError:
        raise ValueError(
            f"unknown provider protocol {protocol!r} (known: {', '.join(PROTOCOLS)})"
        ) from None


__all__ = ["PROTOCOLS", "adapter_for"]
