"""The OpenAI Responses door: ``POST /v1/responses`` on the spine (issue 16 item 3).

The body is translated to the common chat form (``responses_translate``), so any endpoint
serves it through its adapter; no provider speaks Responses to Switchyard, so nothing passes
through (``protocol`` is None). The answer is rendered as a Response object, the stream as
the Responses event sequence (``responses_stream``), errors in OpenAI's envelope as on chat.

A door serves one request: it is made (``responses_door``) with the caller and, when the body
names a ``previous_response_id``, that earlier turn, read before the spine runs — a lookup
needs the caller's app and the database, which ``parse`` (synchronous, pure) has neither of.
With ``store`` (the default) the answer is saved before it goes out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse

from gateway import response_store
from gateway.doors.base import CanonicalRequest, Rendering, StreamRenderer
from gateway.doors.responses_stream import ResponsesStream
from gateway.doors.responses_translate import (
    RESPONSE_ID,
    assistant_message,
    chat_body,
    features_needed,
    input_messages,
    output_items,
    response_id,
    response_object,
    response_status,
    response_usage,
    responses_request_parse,
)
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    error_response,
)
from gateway.providers.base import Completion, Usage
from gateway.response_store import StoredTurn
from quotas.core.estimate import request_estimate
from routing.core.overrides import provider_preferences_parse
from tenants.identity import Principal

JSON = dict[str, Any]
SESSION_HEADER = "x-session-id"


@dataclass(frozen=True)
class ResponsesRequest(CanonicalRequest):
    """The canonical request, and what the door needs again to answer it."""

    responses_body: JSON = field(default_factory=dict)  # the client's body, echoed back
    # The conversation up to this turn (earlier turns and this input), chat messages.
    conversation: tuple[JSON, ...] = ()
    store: bool = True


class ResponsesDoor:
    name = "responses"
    protocol: str | None = None

    def __init__(
        self,
        *,
        owner: Principal | None = None,
        previous: StoredTurn | GatewayError | None = None,
    ) -> None:
        self.owner = owner  # who stores; None: the spine will refuse the key anyway
        self.previous = previous  # the turn ``previous_response_id`` names, or why it is not

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> ResponsesRequest:
        body = responses_request_parse(raw, max_bytes=settings.MAX_REQUEST_BODY_BYTES)
        session = headers.get(SESSION_HEADER) or body.get("prompt_cache_key") or None
        history: list[JSON] = []
        previous_id = body.get("previous_response_id")
        if previous_id:
            previous = self.previous
            if isinstance(previous, GatewayError):
                raise previous
            if previous is None or previous.id != previous_id:
                raise NotFound(
                    f"No response '{previous_id}' (stored responses are kept "
                    f"{settings.RESPONSE_RETENTION_SECONDS / 86400:g} days, for the app that "
                    "made them).",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = previous.conversation
            session = session or previous.session or None
        conversation = (*history, *input_messages(body["input"]))
        chat = chat_body(body, conversation)
        stream = bool(body.get("stream"))
        try:
            preferences = provider_preferences_parse(body.get("provider"))
        except ValueError as exc:
            raise InvalidRequest(f"provider: {exc}", param="provider") from None
        return ResponsesRequest(
            door=self,
            body=chat,
            model=chat["model"],
            models=tuple(chat.get("models") or ()),
            estimate=request_estimate(chat),
            stream=stream,
            session_id=session,
            user=chat.get("user"),
            preferences=preferences,
            features=features_needed(chat, stream=stream),
            responses_body=body,
            conversation=conversation,
            store=body.get("store") is not False,
        )

    async def answer(
        self, request: CanonicalRequest, completion: Completion, usage: Usage, how: Rendering
    ) -> JSON:
        assert isinstance(request, ResponsesRequest)
        choices = completion.body.get("choices") or [{}]
        message = choices[0].get("message") or {}
        id_ = response_id(how.call_id)
        status, incomplete = response_status(completion.finish_reason)
        output = output_items(message, response=id_, status=status)
        response = response_object(
            request.responses_body,
            id=id_,
            model=how.model,
            created=how.created,
            status=status,
            output=output,
            usage=response_usage(usage, how.cost(usage)),
            incomplete_details=incomplete,
            completed_at=int(time.time()),
            provider=how.provider,
        )
        await self.keep(request, response, how)
        return response

    def stream_renderer(self, request: CanonicalRequest, how: Rendering) -> StreamRenderer:
        assert isinstance(request, ResponsesRequest)

        async def keep(response: JSON) -> None:
            await self.keep(request, response, how)

        return ResponsesStream(request.responses_body, how, keep=keep)

    def error_response(self, error: GatewayError, headers: Mapping[str, str]) -> HttpResponse:
        return error_response(error, dict(headers))

    async def keep(self, request: ResponsesRequest, response: JSON, how: Rendering) -> None:
        """Store the answer (``store``), so the next turn and ``GET`` find it; ``store`` in
        the answer says whether it was."""
        if not request.store or self.owner is None:
            return
        response["store"] = await response_store.response_save(
            id=response["id"],
            owner=self.owner,
            generation_id=how.call_id,
            model=how.model,
            session=request.session_id or response["id"],
            conversation=[*request.conversation, assistant_message(response["output"])],
            response=response,
        )


async def responses_door(request: HttpRequest, owner: Principal | None) -> ResponsesDoor:
    """The door for one request: the caller (``owner``, None when its key did not identify:
    the spine refuses it) and the turn its ``previous_response_id`` names, read now."""
    previous: StoredTurn | GatewayError | None = None
    previous_id = _previous_id(request.body) if owner is not None else None
    if owner is not None and previous_id:
        try:
            previous = await response_store.turn_find(app_id=owner.app_id, id=previous_id)
        except Exception as exc:  # the database: the spine answers it in the envelope
            previous = ServiceUnavailable(
                "Switchyard cannot read stored responses right now; retry shortly."
            )
            previous.__cause__ = exc
    return ResponsesDoor(owner=owner, previous=previous)


def _previous_id(raw: bytes) -> str | None:
    """The ``previous_response_id`` of a body, if it is one; ``parse`` validates the rest."""
    if b"previous_response_id" not in raw:  # most bodies: no second JSON parse
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    value = body.get("previous_response_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) and RESPONSE_ID.fullmatch(value) else None
