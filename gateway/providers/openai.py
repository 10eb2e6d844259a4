"""OpenAI-compatible Chat Completions adapter (OpenAI, Azure OpenAI, vLLM and most hosts).

The canonical request already is this protocol, so translation is mostly pass-through: strip
the gateway's own fields, name the upstream model, and make sure a stream reports usage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.providers.base import (
    JSON,
    Classified,
    Completion,
    LimitObservation,
    Outcome,
    RateLimitInfo,
    SSEEvent,
    StreamError,
    UpstreamRequest,
    Usage,
)
from gateway.providers.errors import (
    ProviderError,
    classified,
    error_from_object,
    malformed,
    outcome_for_status,
    read_error,
)
from gateway.providers.headers import lower_keys, parse_go_duration, parse_number, parse_retry_after

# Request fields that steer the gateway and mean nothing (or something else) to a provider:
# OpenRouter-style routing (``provider``, ``models``, ``route``, ``transforms``, ``plugins``,
# ``usage: {include}``) and Switchyard's own extensions.
GATEWAY_ONLY_FIELDS = frozenset(
    {
        "provider",
        "models",
        "route",
        "transforms",
        "plugins",
        "usage",
        "switchyard",
        "workload",
        "workload_class",
        "idempotency_key",
        "queue",
        "deadline",
    }
)

# error.code / error.type values that mean money or quota is exhausted: waiting seconds will not
# help (OpenAI error-codes guide; ``insufficient_quota`` is the type they all share).
QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
        "billing_hard_limit_reached",
        "billing_not_active",
        "access_terminated",
    }
)

# Error types/codes seen inside streams, mapped to the status they would have had.
_STATUS_FOR_CODE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "model_not_found": 404,
    "rate_limit_exceeded": 429,
    "rate_limit_error": 429,
    "requests": 429,
    "tokens": 429,
    "slow_down": 429,
    "server_error": 500,
    "api_error": 500,
    "overloaded": 503,
    "overloaded_error": 529,
    "service_unavailable": 503,
    "timeout": 504,
}


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def usage_from_openai(raw: Any) -> Usage | None:
    """Canonical usage from an OpenAI ``usage`` object; None when there is none."""
    if not isinstance(raw, dict) or not ("prompt_tokens" in raw or "completion_tokens" in raw):
        return None
    details = raw.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(
        input_tokens=_count(raw.get("prompt_tokens")),
        cached_input_tokens=cached,
        output_tokens=_count(raw.get("completion_tokens")),
    )


def _outcome(status: int, error: ProviderError) -> Outcome:
    exhausted = error.code in QUOTA_CODES or error.type in QUOTA_CODES or error.says_exhausted()
    if status in (400, 402, 429) and exhausted:
        return Outcome.POLICY
    return outcome_for_status(status)


def classify_openai_error(status: int, error: ProviderError) -> Classified:
    return classified(_outcome(status, error), error, status)


def _stream_error(raw: Any) -> Classified:
    """An error object found inside a stream, classified by its code/type (or numeric code)."""
    error = error_from_object(raw)
    numeric = raw.get("code") if isinstance(raw, dict) else None
    if isinstance(numeric, int) and not isinstance(numeric, bool) and 400 <= numeric < 600:
        status = numeric  # OpenRouter-style mid-stream errors carry the HTTP status as code
    elif error.code in QUOTA_CODES or error.type in QUOTA_CODES:
        status = 429  # what OpenAI answers for exhausted quota outside a stream
    else:
        status = _STATUS_FOR_CODE.get(error.code) or _STATUS_FOR_CODE.get(error.type) or 500
    return classified(_outcome(status, error), error)


@dataclass
class OpenAIStreamTranslator:
    """Passes chunks through with the gateway's id/model/created; keeps usage and finish."""

    response_id: str
    model: str
    created: int
    usage: Usage | None = None
    finish_reason: str = ""
    _done: bool = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[JSON]:
        data = event.data.strip()
        if data == "[DONE]":
            self._done = True
            return []
        if not data:
            return []
        try:
            chunk = orjson.loads(data)  # as the whole answers (dispatch.py): ~4x json's speed
        except ValueError:
            raise StreamError(malformed("stream event")) from None
        if not isinstance(chunk, dict):
            raise StreamError(malformed("stream event"))
        if chunk.get("error") or event.event == "error":
            raise StreamError(_stream_error(chunk.get("error", chunk)))
        chunk["id"], chunk["model"], chunk["created"] = self.response_id, self.model, self.created
        chunk.setdefault("object", "chat.completion.chunk")
        usage = usage_from_openai(chunk.get("usage"))
        if usage is not None:
            self.usage = usage
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("finish_reason"):
                    self.finish_reason = str(choice["finish_reason"])
        return [chunk]


class OpenAIAdapter:
    protocol = "openai"

    def build_request(
        self, body: JSON, *, upstream_model: str, api_key: str, stream: bool, max_output: int
    ) -> UpstreamRequest:
        """The canonical body minus gateway fields; ``max_output`` is not invented for OpenAI."""
        wire = {key: value for key, value in body.items() if key not in GATEWAY_ONLY_FIELDS}
        wire["model"] = upstream_model
        if stream:
            wire["stream"] = True
            options = wire.get("stream_options")
            # The gateway reconciles from the usage chunk even when the client did not ask.
            wire["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        else:
            wire.pop("stream", None)
            wire.pop("stream_options", None)  # OpenAI rejects stream_options without stream
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        return UpstreamRequest(path="/chat/completions", headers=headers, json=wire)

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
        """The chat door's body is both canonical and native: the same request either way."""
        return self.build_request(
            native,
            upstream_model=upstream_model,
            api_key=api_key,
            stream=stream,
            max_output=max_output,
        )

    def parse_completion(
        self, data: JSON, *, response_id: str, model: str, created: int | None = None
    ) -> Completion:
        if not isinstance(data, dict):
            raise StreamError(malformed("response"))
        if data.get("error"):
            raise StreamError(_stream_error(data["error"]))
        choices = data.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise StreamError(malformed("response"))
        body = {**data, "id": response_id, "model": model, "object": "chat.completion"}
        if created is not None:
            body["created"] = created
        finish = next((str(c["finish_reason"]) for c in choices if c.get("finish_reason")), "")
        usage = usage_from_openai(data.get("usage"))
        return Completion(body=body, usage=usage, finish_reason=finish)

    def build_embeddings_request(
        self, body: JSON, *, upstream_model: str, api_key: str
    ) -> UpstreamRequest:
        """``POST /embeddings``: the body as it came, minus gateway fields, naming the upstream
        model (``encoding_format`` passes through: base64 is the provider's to encode)."""
        wire = {key: value for key, value in body.items() if key not in GATEWAY_ONLY_FIELDS}
        wire["model"] = upstream_model
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        return UpstreamRequest(path="/embeddings", headers=headers, json=wire)

    def parse_embeddings(self, data: JSON, *, model: str) -> Completion:
        if not isinstance(data, dict):
            raise StreamError(malformed("response"))
        if data.get("error"):
            raise StreamError(_stream_error(data["error"]))
        items = data.get("data")
        if not isinstance(items, list) or not all(
            isinstance(item, dict) and isinstance(item.get("embedding"), list | str)
            for item in items
        ):
            raise StreamError(malformed("response"))
        usage = usage_from_openai(data.get("usage"))
        body: JSON = {"object": "list", "data": items, "model": model}
        if usage is not None:
            body["usage"] = {
                "prompt_tokens": usage.input_tokens,
                "total_tokens": usage.input_tokens,
            }
        return Completion(body=body, usage=usage, finish_reason="stop")

    def stream_translator(
        self, *, response_id: str, model: str, created: int
    ) -> OpenAIStreamTranslator:
        return OpenAIStreamTranslator(response_id=response_id, model=model, created=created)

    def rate_limits(self, headers: Mapping[str, str], *, now: float) -> RateLimitInfo:
        """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` and the retry hints."""
        lower = lower_keys(headers)
        observations = []
        for dimension in ("requests", "tokens"):
            limit = parse_number(lower.get(f"x-ratelimit-limit-{dimension}"))
            remaining = parse_number(lower.get(f"x-ratelimit-remaining-{dimension}"))
            reset_after = parse_go_duration(lower.get(f"x-ratelimit-reset-{dimension}"))
            if limit is not None or remaining is not None or reset_after is not None:
                observations.append(LimitObservation(dimension, limit, remaining, reset_after))
        return RateLimitInfo(tuple(observations), parse_retry_after(lower, now=now))

    def classify(self, status: int, headers: Mapping[str, str], body: bytes) -> Classified:
        return classify_openai_error(status, read_error(body))
