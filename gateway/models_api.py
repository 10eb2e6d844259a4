"""``GET /v1/models`` and ``/v1/models/{id}``: the models a key may use, as OpenAI's SDKs parse
them (``model_objects``); answered from the configuration snapshot, with no database query."""

from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse

from gateway.errors import GatewayError, UnknownModel, error_response
from gateway.intake import principal_identify, snapshot_current
from gateway.model_objects import model_object
from gateway.responses import json_response


async def models_list(request: HttpRequest) -> HttpResponse:
    """``GET /v1/models``: the models this key may use."""
    try:
        snapshot = await snapshot_current()
        principal = principal_identify(snapshot, request, time.time())
    except GatewayError as error:
        return error_response(error)
    catalogue = snapshot.catalogue
    # Every name a client may send: each model under its id, then under each of its aliases.
    names = sorted([*((slug, slug) for slug in catalogue.models), *catalogue.aliases.items()])
    data = [
        model_object(model, name)
        for name, slug in names
        if (model := catalogue.models[slug]).endpoints and principal.may_use(slug)
    ]
    return json_response({"object": "list", "data": data})


async def model_detail(request: HttpRequest, model_id: str) -> HttpResponse:
    """``GET /v1/models/{id}`` (the SDKs' ``models.retrieve``): one model this key may use."""
    try:
        snapshot = await snapshot_current()
        principal = principal_identify(snapshot, request, time.time())
        model = snapshot.catalogue.model_named(model_id)
        if model is None or not model.endpoints or not principal.may_use(model.slug):
            # The same answer whether it does not exist or this key may not see it.
            raise UnknownModel(f"The model '{model_id}' does not exist.")
    except GatewayError as error:
        return error_response(error)
    return json_response(model_object(model, model_id))
