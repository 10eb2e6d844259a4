"""Reading provider error envelopes, whatever shape (or non-shape) they come in.

OpenAI: ``{"error": {"message", "type", "param", "code"}}``; Anthropic:
``{"type": "error", "error": {"type", "message", "details": {"error_code"}}}``; compatible
servers also send ``{"error": "text"}``, ``{"message": …}``, ``{"detail": …}`` or HTML.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.providers.base import Classified, Outcome

MESSAGE_LIMIT = 300

# Wording of spend-cap / billing / exhausted-quota refusals across providers. Used only as a
# fallback when no structured code says so (Anthropic asks not to match on messages). Not a bare
# "billing": OpenAI's ordinary rate-limit message links to .../account/billing.
_EXHAUSTION_WORDS = re.compile(
    r"exceeded your current quota|insufficient[ _]quota|spend(?:ing)?[ _]limit|usage limit"
    r"|credit balance|insufficient[ _](?:credits|balance|funds)|plan and billing|payment required"
    r"|regain access",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ProviderError:
    """The parts of an error envelope classification looks at (empty strings when absent)."""

    type: str = ""
    code: str = ""
    detail_code: str = ""  # Anthropic's error.details.error_code
    message: str = ""

    @property
    def provider_code(self) -> str:
        return self.detail_code or self.code or self.type

    def says_exhausted(self) -> bool:
        """True when the message reads like a spend cap, billing problem or exhausted quota."""
        return bool(_EXHAUSTION_WORDS.search(self.message))


def truncate(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def error_from_object(error: Any) -> ProviderError:
    """A ProviderError from a decoded ``error`` member (dict or string)."""
    if isinstance(error, str):
        return ProviderError(message=truncate(error))
    if not isinstance(error, dict):
        return ProviderError()
    details = error.get("details")
    detail_code = _text(details.get("error_code")) if isinstance(details, dict) else ""
    return ProviderError(
        type=_text(error.get("type")),
        code=_text(error.get("code")),
        detail_code=detail_code,
        message=truncate(_text(error.get("message"))),
    )


def read_error(body: bytes) -> ProviderError:
    """Parse an error body; never raises. A non-JSON body becomes the (truncated) message."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ProviderError(message=truncate(body.decode("utf-8", "replace")))
    if not isinstance(data, dict):
        return ProviderError(message=truncate(_text(data)))
    if "error" in data and data["error"] is not None:
        return error_from_object(data["error"])
    return ProviderError(message=truncate(_text(data.get("message") or data.get("detail"))))


def outcome_for_status(status: int) -> Outcome:
    """SPEC F1 by status alone; adapters refine 429 / 400 / 5xx with what the body says."""
    if 200 <= status < 300:
        return Outcome.OK
    if status == 401:
        return Outcome.AUTH
    if status in (402, 403):
        return Outcome.POLICY
    if status == 429:
        return Outcome.CAPACITY
    if status in (408, 409):  # upstream timeout / conflict: the request itself may be fine
        return Outcome.PROVIDER_ERROR
    if 400 <= status < 500:
        return Outcome.REQUEST_ERROR
    if status in (503, 529):
        return Outcome.OVERLOAD
    return Outcome.PROVIDER_ERROR


def classified(outcome: Outcome, error: ProviderError, status: int | None = None) -> Classified:
    """A Classified with the provider's message, or a neutral one naming the status."""
    fallback = f"provider answered HTTP {status}" if status else "provider reported an error"
    return Classified(outcome, error.message or fallback, error.provider_code)


def malformed(what: str) -> Classified:
    """A provider answer we cannot read: the provider's fault, retryable elsewhere (G8)."""
    return Classified(Outcome.PROVIDER_ERROR, f"malformed provider {what}", "malformed_response")
