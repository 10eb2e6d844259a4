"""Anthropic Messages adapter: full translation to and from the canonical OpenAI shape.

Request translation lives in ``anthropic_request``, the stream translator in
``anthropic_stream``; this module holds the adapter, response parsing, rate-limit headers and
the classification of errors.

429 rules (reliability research §1.2; SPEC F1):
1. ``error.details.error_code`` naming a spend limit, or ``billing_error`` → POLICY, whatever the
   status or headers say.
2. ``ramp_limit_exceeded`` → CAPACITY (acceleration limit; it comes with ``retry-after``).
3. A 429 *without a valid* ``retry-after`` whose message reads like a spend cap, quota or
   billing refusal → POLICY (older spend-cap answers carried no details code).
4. Any other 429 → CAPACITY. Without ``retry-after`` the broker must back off (F3) within its
   retry budget; it never gets a "retry now" from us.
A 400 whose message reads like a spend or credit limit is POLICY too ("credit balance is too
low", "reached your specified API usage limits"): the account, not the request, is at fault.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from gateway.providers.anthropic_request import messages_request
from gateway.providers.anthropic_stream import (
    AnthropicStreamTranslator,
    finish_reason_for,
    string_field,
    usage_from_anthropic,
)
from gateway.providers.base import (
    JSON,
    Classified,
    Completion,
    LimitObservation,
    Outcome,
    RateLimitInfo,
    StreamError,
    UpstreamRequest,
)
from gateway.providers.errors import (
    ProviderError,
    classified,
    error_from_object,
    malformed,
    outcome_for_status,
    read_error,
)
from gateway.providers.headers import (
    has_retry_after,
    lower_keys,
    parse_number,
    parse_retry_after,
    seconds_until,
)

API_VERSION = "2023-06-01"

SPEND_LIMIT_CODES = frozenset(
    {
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        "linked_organization_spend_limit_reached",
        "linked_organization_billing_unavailable",
    }
)

# error.type → the HTTP status it stands for (Anthropic's errors page), for in-stream errors.
STATUS_FOR_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# header family → canonical dimension
_FAMILIES = (
    ("requests", "requests"),
    ("tokens", "tokens"),
    ("input-tokens", "input_tokens"),
    ("output-tokens", "output_tokens"),
)


def anthropic_outcome(status: int, error: ProviderError, *, retry_after: bool) -> Outcome:
    """The module docstring's rules; ``retry_after``: a valid Retry-After came with it."""
    if 200 <= status < 300:
        return Outcome.OK
    if error.detail_code in SPEND_LIMIT_CODES or error.type == "billing_error":
        return Outcome.POLICY
    if status == 429:
        if error.detail_code == "ramp_limit_exceeded":
            return Outcome.CAPACITY
        if not retry_after and error.says_exhausted():
            return Outcome.POLICY
        return Outcome.CAPACITY
    if status == 400 and error.says_exhausted():
        return Outcome.POLICY
    if error.type == "overloaded_error" and status >= 500:
        return Outcome.OVERLOAD
    return outcome_for_status(status)


def classify_stream_error(raw: Any) -> Classified:
    """An ``error`` event inside a stream: its type stands in for the status."""
    error = error_from_object(raw)
    status = STATUS_FOR_TYPE.get(error.type, 500)
    return classified(anthropic_outcome(status, error, retry_after=False), error)


def _content(blocks: list[Any]) -> tuple[str, list[JSON]]:
    """(text, tool_calls) of a message's content blocks; thinking and server blocks are skipped."""
    texts: list[str] = []
    tool_calls: list[JSON] = []
    for block in blocks:
        if block["type"] == "text":
            texts.append(string_field(block["text"]))
        elif block["type"] == "tool_use":
            arguments = json.dumps(block.get("input") or {}, separators=(",", ":"))
            function = {"name": string_field(block["name"]), "arguments": arguments}
            tool_calls.append(
                {"id": string_field(block["id"]), "type": "function", "function": function}
            )
    return "".join(texts), tool_calls


class AnthropicAdapter:
    protocol = "anthropic"

    def build_request(
        self, body: JSON, *, upstream_model: str, api_key: str, stream: bool, max_output: int
    ) -> UpstreamRequest:
        """``POST /v1/messages``; raises ``RequestNotSupported`` for untranslatable requests."""
        wire = messages_request(
            body, upstream_model=upstream_model, stream=stream, max_output=max_output
        )
        headers = {
            "x-api-key": api_key,
            "anthropic-version": API_VERSION,
            "content-type": "application/json",
        }
        return UpstreamRequest(path="/v1/messages", headers=headers, json=wire)

    def build_native_request(
        self,
        native: JSON,
        *,
        upstream_model: str,
        api_key: str,
        stream: bool,
        max_output: int,
        headers: Mapping[str, str],
    ) -> UpstreamRequest:
        """A Messages body from the Messages door, with every field it holds (``cache_control``,
        ``thinking``, betas …); ``max_tokens`` is required by the protocol, so it is the
        door's or the endpoint's maximum."""
        wire = {**native, "model": upstream_model}
        wire.setdefault("max_tokens", max_output)
        if stream:
            wire["stream"] = True
        else:
            wire.pop("stream", None)
        wire_headers = {
            "x-api-key": api_key,
            "anthropic-version": headers.get("anthropic-version") or API_VERSION,
            "content-type": "application/json",
        }
        if headers.get("anthropic-beta"):
            wire_headers["anthropic-beta"] = headers["anthropic-beta"]
        return UpstreamRequest(path="/v1/messages", headers=wire_headers, json=wire)

    def parse_completion(
        self, data: JSON, *, response_id: str, model: str, created: int | None = None
    ) -> Completion:
        """A Messages response as a chat.completion (``created`` defaults to the wall clock)."""
        if not isinstance(data, dict):
            raise StreamError(malformed("response"))
        if data.get("type") == "error":
            raise StreamError(classify_stream_error(data.get("error")))
        blocks = data.get("content")
        if not isinstance(blocks, list):
            raise StreamError(malformed("response"))
        try:
            text, tool_calls = _content(blocks)
        except (KeyError, TypeError, AttributeError):
            raise StreamError(malformed("response")) from None
        message: JSON = {"role": "assistant", "content": text or (None if tool_calls else "")}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = finish_reason_for(data.get("stop_reason")) or "stop"
        usage = usage_from_anthropic(data.get("usage"))
        body: JSON = {
            "id": response_id,
            "object": "chat.completion",
            "created": created if created is not None else int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if usage is not None:
            body["usage"] = usage.as_openai()
        return Completion(body=body, usage=usage, finish_reason=finish)

    def stream_translator(
        self, *, response_id: str, model: str, created: int
    ) -> AnthropicStreamTranslator:
        return AnthropicStreamTranslator(
            response_id=response_id,
            model=model,
            created=created,
            classify_error=classify_stream_error,
        )

    def rate_limits(self, headers: Mapping[str, str], *, now: float) -> RateLimitInfo:
        """``anthropic-ratelimit-{family}-{limit,remaining,reset}`` (reset: RFC 3339)."""
        lower = lower_keys(headers)
        observations = []
        for family, dimension in _FAMILIES:
            prefix = f"anthropic-ratelimit-{family}-"
            limit = parse_number(lower.get(prefix + "limit"))
            remaining = parse_number(lower.get(prefix + "remaining"))
            reset_after = seconds_until(lower.get(prefix + "reset"), now=now)
            if limit is not None or remaining is not None or reset_after is not None:
                observations.append(LimitObservation(dimension, limit, remaining, reset_after))
        return RateLimitInfo(tuple(observations), parse_retry_after(lower, now=now))

    def classify(self, status: int, headers: Mapping[str, str], body: bytes) -> Classified:
        error = read_error(body)
        retry_after = has_retry_after(lower_keys(headers))
        return classified(anthropic_outcome(status, error, retry_after=retry_after), error, status)
