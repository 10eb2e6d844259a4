"""``GET`` / ``DELETE /v1/responses/{id}``: a stored answer of the Responses door.

A stored response is visible to the keys of the app that made it; any other id, another app's
included, is the same 404 (``gateway/response_store.py``).
"""

from __future__ import annotations

from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.db import FreshConnectionView
from gateway import response_store
from gateway.authentication import principal_of
from gateway.doors.responses_translate import RESPONSE_ID
from gateway.errors import InvalidRequest, NotFound


class ResponseDetail(FreshConnectionView, APIView):
    renderer_classes = [JSONRenderer]

    def get(self, request: Request, response_id: str) -> Response:
        app_id = _app_checked(request, response_id)
        stored = response_store.response_find(app_id=app_id, id=response_id)
        if stored is None:
            raise _not_found(response_id)
        return Response(stored)

    def delete(self, request: Request, response_id: str) -> Response:
        app_id = _app_checked(request, response_id)
        if not response_store.response_delete(app_id=app_id, id=response_id):
            raise _not_found(response_id)
        return Response({"id": response_id, "object": "response.deleted", "deleted": True})


def _app_checked(request: Request, response_id: str) -> int:
    app_id = principal_of(request).app_id
    if not RESPONSE_ID.fullmatch(response_id):
        raise InvalidRequest("Pass the id of a response: /v1/responses/resp_…", param="id")
    return app_id


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"No response {response_id}.", code="response_not_found")
