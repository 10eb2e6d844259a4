"""``POST /v1/messages/count_tokens``: how many input tokens a Messages request is, as the broker
estimates it (the count it reserves by, before an endpoint's learned correction). No provider is
asked and nothing is reserved; the key must be valid and may use the model, as for the request."""

from __future__ import annotations

import time
import uuid

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from common.errors import GatewayError
from gateway.doors.messages import MESSAGES_DOOR, count_tokens_parse
from gateway.errors import PermissionDenied, UnknownModel
from gateway.intake import principal_identify, raw_body, snapshot_current
from gateway.responses import REQUEST_ID_HEADER, json_response
from routing.core.overrides import model_suffix_split


async def messages_count_tokens(request: HttpRequest) -> HttpResponse:
    request_id = f"gen-{uuid.uuid4().hex}"
    try:
        snapshot = await snapshot_current()
        principal = principal_identify(snapshot, request, time.time())
        model, tokens = count_tokens_parse(
            raw_body(request), max_bytes=settings.MAX_REQUEST_BODY_BYTES
        )
        name, _ = model_suffix_split(model)
        entry = snapshot.catalogue.model_named(name)  # its slug, or an alias
        if entry is None or not entry.endpoints:
            raise UnknownModel(f"The model '{model}' does not exist.", param="model")
        if not principal.may_use(entry.slug):
            raise PermissionDenied(
                f"This API key may not use the model '{entry.slug}'.", param="model"
            )
    except GatewayError as error:
        return MESSAGES_DOOR.error_response(error, {REQUEST_ID_HEADER: request_id})
    return json_response({"input_tokens": tokens}, headers={REQUEST_ID_HEADER: request_id})
