"""Thin views: each hands the request to one service."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

from gateway import models_api, openapi, pipeline, responses_intake, token_count
from gateway.doors.base import Door
from gateway.doors.chat import CHAT
from gateway.doors.embeddings import EMBEDDINGS_DOOR
from gateway.doors.messages import MESSAGES_DOOR
from gateway.errors import GatewayError, MethodNotAllowed, NotFound, error_response


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST")
    return await pipeline.serve(request, CHAT)


@csrf_exempt
async def messages(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """Anthropic Messages; its query string (``?beta=true``, Claude Code's) changes nothing."""
    if request.method != "POST":
        return _method_not_allowed("POST", MESSAGES_DOOR)
    return await pipeline.serve(request, MESSAGES_DOOR)


@csrf_exempt
async def messages_count_tokens(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST", MESSAGES_DOOR)
    return await token_count.messages_count_tokens(request)


@csrf_exempt
async def embeddings(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST")
    return await pipeline.serve(request, EMBEDDINGS_DOOR)


@csrf_exempt
async def responses_create(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST")
    door = await responses_intake.responses_door(request)
    return await pipeline.serve(request, door, identified=door.owner)


async def models_list(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    return await models_api.models_list(request)


async def model_detail(request: HttpRequest, model_id: str) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    return await models_api.model_detail(request, model_id)


async def openapi_json(request: HttpRequest) -> HttpResponse:
    """``GET /v1/openapi.json``: the request contract, for anyone (it holds no secret)."""
    if request.method != "GET":
        return _method_not_allowed("GET")
    return HttpResponse(openapi.openapi_json(), content_type="application/json")


def _method_not_allowed(allowed: str, door: Door = CHAT) -> HttpResponse:
    return door.error_response(
        MethodNotAllowed(f"Use {allowed} for this endpoint."), {"Allow": allowed}
    )


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if is_api_path(request.path):
        return error_response(NotFound(f"There is no endpoint at {request.path}."))
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    # A 500 is a bug; still, an API client gets the envelope, not an HTML page.
    if is_api_path(request.path):
        return error_response(GatewayError("Internal error; it has been logged."))
    return defaults.server_error(request)


def is_api_path(path: str) -> bool:
    """``/v1`` and below: the proxy's, answered in the envelope (unknown paths too)."""
    return path == "/v1" or path.startswith("/v1/")
