"""What the broker learns from a provider answer: the usage it reports and the rate limits its
headers describe (SPEC C6, C12). The provider adapters (``gateway/providers/``) produce these
from each provider's wire format; the broker reconciles and learns from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """Tokens a provider reported. ``input_tokens`` includes the cached ones."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_openai(self) -> JSON:
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_input_tokens},
        }


@dataclass(frozen=True)
class LimitObservation:
    """One provider bucket as its headers describe it at the time of the response (C12)."""

    dimension: str  # requests | tokens | input_tokens | output_tokens
    limit: float | None
    remaining: float | None
    reset_after: float | None  # seconds until the bucket is full again


@dataclass(frozen=True)
class RateLimitInfo:
    observations: tuple[LimitObservation, ...] = ()
    retry_after: float | None = None  # seconds; a floor, not a hint (F2)
