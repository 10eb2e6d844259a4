"""``POST /v1/chat/completions``: OpenAI Chat Completions, the door whose body is already the
canonical form (SPEC C1).

Unknown fields go through to OpenAI-protocol providers untouched (``reasoning_effort``,
``store``, …), since the chat body is what the OpenAI adapter sends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpResponse

from gateway.doors.base import JSON, CanonicalRequest, Rendering
from gateway.errors import GatewayError, InvalidRequest, error_response
from gateway.providers.base import Completion, SSEEvent, Usage
from gateway.providers.openai import usage_from_openai
from gateway.validation import chat_request_parse
from quotas.core.estimate import request_estimate
from routing.core.overrides import ProviderPreferences, provider_preferences_parse

SESSION_HEADER = "x-session-id"
DONE = b"data: [DONE]\n\n"


class ChatDoor:
    name = "chat"
    protocol = "openai"

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> CanonicalRequest:
        body = chat_request_parse(raw, max_bytes=settings.MAX_REQUEST_BODY_BYTES)
        stream = bool(body.get("stream"))
        return CanonicalRequest(
            door=self,
            body=body,
            model=body["model"],
            models=tuple(body.get("models") or ()),
            estimate=request_estimate(body),
            stream=stream,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            session_id=headers.get(SESSION_HEADER),
            user=body.get("user"),
            preferences=preferences_parse(body.get("provider")),
            features=requested_features(body, stream=stream),
        )

    async def answer(
        self, request: CanonicalRequest, completion: Completion, usage: Usage, how: Rendering
    ) -> JSON:
        result = completion.body
        result["provider"] = how.provider
        result.setdefault("usage", usage.as_openai())["cost"] = how.cost(usage)
        return result

    def stream_renderer(self, request: CanonicalRequest, how: Rendering) -> ChatStream:
        return ChatStream(include_usage=request.include_usage, how=how)

    def error_response(self, error: GatewayError, headers: Mapping[str, str]) -> HttpResponse:
        return error_response(error, dict(headers))


class ChatStream:
    """OpenAI ``chat.completion.chunk`` events, each naming the provider; the usage chunk only
    when the client asked for it (``stream_options.include_usage``), with its cost."""

    def __init__(self, *, include_usage: bool, how: Rendering) -> None:
        self.include_usage = include_usage
        self.how = how

    def feed(self, event: SSEEvent, chunks: list[JSON]) -> bytes:
        out = []
        for chunk in chunks:
            if chunk.get("usage") is not None and not chunk.get("choices"):
                if not self.include_usage:
                    continue
                chunk["usage"]["cost"] = self.how.cost(_usage_of(chunk))
            chunk["provider"] = self.how.provider
            out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        return b"".join(out)

    async def close(self, usage: Usage | None, finish_reason: str) -> bytes:
        return DONE

    def fail(self, error: GatewayError) -> bytes:
        return b"data: " + orjson.dumps(error.envelope()) + b"\n\n" + DONE


def _usage_of(chunk: JSON) -> Usage:
    return usage_from_openai(chunk.get("usage")) or Usage()


def preferences_parse(value: Any) -> ProviderPreferences:
    """The request's ``provider`` object (G13), or a 400 naming what is wrong with it."""
    try:
        return provider_preferences_parse(value)
    except ValueError as exc:
        raise InvalidRequest(f"provider: {exc}", param="provider") from None


def requested_features(body: Mapping[str, Any], *, stream: bool) -> frozenset[str]:
    """The capabilities (``supports``) a chat-form request needs from an endpoint.

    A ``response_format`` of type ``text`` is the default answer: it needs nothing.
    """
    features = {"tools"} if body.get("tools") else set()
    response_format = body.get("response_format") or {}
    if response_format and response_format.get("type", "text") != "text":
        features.add("response_format")
    if stream:
        features.add("stream")
    return frozenset(features)


CHAT = ChatDoor()
