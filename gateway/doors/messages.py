"""The Anthropic Messages front door: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

A coding agent that speaks Anthropic's protocol (Claude Code, the ``anthropic`` SDK) sends its
requests here unchanged. The body is validated and translated once into the common form
(``messages_request``); an Anthropic-protocol endpoint gets the native body with its
``cache_control``, ``thinking`` and ``anthropic-beta`` headers intact, any other endpoint the
translation. Answers, streams and refusals go back in Anthropic's protocol, with its status
codes and error types, so the SDK raises the error class it would raise for Anthropic itself
(``RateLimitError`` with ``retry-after``, ``OverloadedError`` …).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpResponse

from common.errors import GatewayError
from gateway.doors.base import CanonicalRequest, Rendering
from gateway.doors.chat import preferences_parse
from gateway.doors.messages_answer import message_from_chat, message_passed_through
from gateway.doors.messages_request import chat_body, messages_validate
from gateway.doors.messages_stream import MessagesStreamRenderer
from gateway.errors import InvalidRequest
from gateway.providers.base import Completion, Usage
from gateway.validation import json_object_parse
from quotas.core.estimate import request_estimate

JSON = dict[str, Any]

# Switchyard's own fields, taken out of the native body (Anthropic rejects unknown fields).
SWITCHYARD_FIELDS = ("provider", "models")
# Request headers an Anthropic-protocol endpoint gets as they came.
PASSED_HEADERS = ("anthropic-beta", "anthropic-version")
MAX_MODELS = 8  # fallback models, as the chat door takes them
SESSION_HEADER = "x-session-id"
# Claude Code names its session in a header of its own (its metadata.user_id holds it too).
AGENT_SESSION_HEADER = "x-claude-code-session-id"

# Anthropic's error types by status (its errors page); a 503 of ours — the providers are
# overloaded or out of quota, or Switchyard's own state is away — is its 529: the SDK and
# Claude Code back off and retry it, as they would Anthropic's.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
OVERLOADED = 529


def anthropic_status(error: GatewayError) -> int:
    return OVERLOADED if error.status == 503 else error.status


def error_type_for(error: GatewayError) -> str:
    return ERROR_TYPES.get(anthropic_status(error), "api_error")


def error_envelope(error: GatewayError, request_id: str | None = None) -> JSON:
    """Anthropic's envelope; Switchyard's code and reason ride along in the error object."""
    envelope: JSON = {
        "type": "error",
        "error": {
            "type": error_type_for(error),
            "message": error.message,
            "code": error.code,
            "reason": error.reason,
        },
    }
    if error.param:
        envelope["error"]["param"] = error.param
    if request_id:
        envelope["request_id"] = request_id
    return envelope


def _native(body: JSON) -> JSON:
    return {name: value for name, value in body.items() if name not in SWITCHYARD_FIELDS}


class MessagesDoor:
    name = "messages"
    protocol: str | None = "anthropic"

    def __init__(self, *, max_bytes: int | None = None) -> None:
        self._max_bytes = max_bytes

    @property
    def max_bytes(self) -> int:
        return self._max_bytes or int(settings.MAX_REQUEST_BODY_BYTES)

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> CanonicalRequest:
        body = messages_validate(json_object_parse(raw, max_bytes=self.max_bytes))
        preferences = preferences_parse(body.get("provider"))
        models = body.get("models") or []
        if not (
            isinstance(models, list)
            and len(models) <= MAX_MODELS
            and all(isinstance(m, str) for m in models)
        ):
            raise InvalidRequest(
                f"models: must be a list of at most {MAX_MODELS} model names.",
                param="models",
                code="invalid_value",
            )
        common = chat_body(body)
        common["models"] = models
        stream = body.get("stream") is True
        user_id = (body.get("metadata") or {}).get("user_id") or None
        lower = {name.lower(): value for name, value in headers.items()}
        features = {"stream"} if stream else set()
        if common.get("tools"):
            features.add("tools")
        return CanonicalRequest(
            door=self,
            body=common,
            model=body["model"],
            estimate=request_estimate(common),
            models=tuple(models),
            native=_native(body),
            stream=stream,
            session_id=lower.get(SESSION_HEADER) or lower.get(AGENT_SESSION_HEADER) or user_id,
            user=user_id,
            preferences=preferences,
            features=frozenset(features),
            headers={name: lower[name] for name in PASSED_HEADERS if lower.get(name)},
        )

    async def answer(
        self, request: CanonicalRequest, completion: Completion, usage: Usage, how: Rendering
    ) -> JSON:
        if how.passthrough and completion.native is not None:
            return message_passed_through(
                completion.native, message_id=how.call_id, model=how.model
            )
        return message_from_chat(
            completion.body,
            usage,
            message_id=how.call_id,
            model=how.model,
            finish_reason=completion.finish_reason,
        )

    def stream_renderer(self, request: CanonicalRequest, how: Rendering) -> MessagesStreamRenderer:
        return MessagesStreamRenderer(
            message_id=how.call_id,
            model=how.model,
            input_tokens=request.estimate.input_tokens,
            passthrough=how.passthrough,
            error_type_for=error_type_for,
        )

    def error_response(self, error: GatewayError, headers: Mapping[str, str]) -> HttpResponse:
        merged = {**error.headers, **headers}
        request_id = merged.get("x-request-id")
        response = HttpResponse(
            orjson.dumps(error_envelope(error, request_id)),
            status=anthropic_status(error),
            content_type="application/json",
        )
        for name, value in merged.items():
            response[name] = value
        return response


def count_tokens_parse(raw: bytes, *, max_bytes: int) -> tuple[str, int]:
    """``POST /v1/messages/count_tokens``: (model, input tokens) from the broker's estimator.

    The body is a Messages request without ``max_tokens``; the count is the same heuristic
    the broker reserves by, before any endpoint's learned correction (no endpoint is chosen).
    """
    body = json_object_parse(raw, max_bytes=max_bytes)
    body = messages_validate({**body, "max_tokens": 1})
    return body["model"], request_estimate(chat_body(body)).input_tokens


MESSAGES_DOOR = MessagesDoor()
