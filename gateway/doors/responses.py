"""The OpenAI Responses door: ``POST /v1/responses`` on the spine (issue 16 item 3).

The body is translated to the common chat form (``responses_translate``), so any endpoint
serves it through its adapter; no provider speaks Responses to Switchyard, so nothing passes
through (``protocol`` is None). The answer is rendered as a Response object, the stream as
the Responses event sequence (``responses_stream``), errors in OpenAI's envelope as on chat.

A door serves one request: it is made (``gateway/responses_intake.py``) with the caller and,
when the body names a ``previous_response_id``, that earlier turn, read before the spine runs —
a lookup needs the caller's app and the database, which ``parse`` (synchronous, pure) has
neither of. With ``store`` (the default) the answer is saved before it goes out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.http import HttpResponse

from gateway import response_store
from gateway.doors.base import CanonicalRequest, Rendering, StreamRenderer
from gateway.doors.chat import SESSION_HEADER, preferences_parse, requested_features
from gateway.doors.responses_stream import ResponsesStream
from gateway.doors.responses_translate import (
    assistant_message,
    chat_body,
    input_messages,
    output_items,
    response_id,
    response_object,
    response_status,
    response_usage,
    responses_request_parse,
)
from gateway.errors import GatewayError, NotFound, error_response
from gateway.providers.base import Completion, Usage
from gateway.response_store import StoredTurn
from quotas.core.estimate import request_estimate
from tenants.identity import Principal

JSON = dict[str, Any]


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

    # A door of its own serves each request (``gateway/responses_intake.py``); one with no
    # caller and no earlier turn, a deferred job's run (``gateway.doors.DOORS``): its answer
    # is not stored.
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
        return ResponsesRequest(
            door=self,
            body=chat,
            model=chat["model"],
            models=tuple(chat.get("models") or ()),
            estimate=request_estimate(chat),
            stream=stream,
            session_id=session,
            user=chat.get("user"),
            preferences=preferences_parse(body.get("provider")),
            features=requested_features(chat, stream=stream),
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
            # Only a session the client named is carried on: without one, the router keys a
            # conversation by its leading messages, which every later turn repeats (G12).
            session=request.session_id or "",
            conversation=[*request.conversation, assistant_message(response["output"])],
            response=response,
        )
