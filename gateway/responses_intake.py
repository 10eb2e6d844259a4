"""What the Responses door needs before the spine runs: who is asking and, when the body
names a ``previous_response_id``, that earlier turn of the caller's app (one read by primary
key). ``parse`` is synchronous and pure, so the door is made with both in hand."""

from __future__ import annotations

import time

import orjson
from django.db import DatabaseError
from django.http import HttpRequest

from gateway import jobs, response_store
from gateway.doors.responses import ResponsesDoor
from gateway.doors.responses_translate import RESPONSE_ID
from gateway.errors import GatewayError, InvalidRequest, ServiceUnavailable
from gateway.intake import principal_identify, raw_body, snapshot_current
from gateway.response_store import StoredTurn


async def responses_door(request: HttpRequest) -> ResponsesDoor:
    """The door for one request: its caller and the turn its ``previous_response_id`` names,
    read now. A key that does not identify, or a body too large to read, gets a door with
    neither: the spine refuses the request in the envelope, as for any door."""
    try:
        snapshot = await snapshot_current()
        owner = principal_identify(snapshot, request, time.time())
        previous_id = previous_id_read(raw_body(request))
    except GatewayError:
        return ResponsesDoor()
    previous: StoredTurn | GatewayError | None = None
    if previous_id is not None and jobs.PREFER_ASYNC in request.headers.get("prefer", "").lower():
        # A job's run parses its stored body again, with no earlier turn to hand.
        previous = InvalidRequest(
            "A deferred request (Prefer: respond-async) cannot continue a stored response; "
            "send previous_response_id without it.",
            param="previous_response_id",
        )
    elif previous_id is not None:
        try:
            previous = await response_store.turn_find(app_id=owner.app_id, id=previous_id)
        except DatabaseError as exc:  # the spine answers it in the envelope, and records it
            previous = ServiceUnavailable(
                "Switchyard cannot read stored responses right now; retry shortly."
            )
            previous.__cause__ = exc
    return ResponsesDoor(owner=owner, previous=previous)


def previous_id_read(raw: bytes) -> str | None:
    """The ``previous_response_id`` of a body, if it is one; ``parse`` validates the rest."""
    if b"previous_response_id" not in raw:  # most bodies: no second JSON parse
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    value = body.get("previous_response_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) and RESPONSE_ID.fullmatch(value) else None
