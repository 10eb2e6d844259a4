"""The Batch API (E5), OpenAI's: ``/v1/files`` and ``/v1/batches``. Thin views over
``gateway/batch_files.py`` and ``gateway/batches.py``.

Files and batches are the tenant's: any key of the tenant sees them, and any other id —
another tenant's included — is the same 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.utils import timezone
from rest_framework.negotiation import BaseContentNegotiation, DefaultContentNegotiation
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.db import FreshConnectionView
from gateway import batch_files, batches
from gateway.authentication import principal_of
from gateway.errors import InvalidRequest

# The forms of the ids; anything else (a NUL, which PostgreSQL cannot compare) is a 400.


class AnyAccept(BaseContentNegotiation):
    """The answer is JSON, or a file's bytes, whatever ``Accept`` says: the ``openai`` SDK asks
    for a file's content with ``Accept: application/binary``, which no renderer names."""

    def select_parser(self, request: Request, parsers: list[Any]) -> Any:
        return DefaultContentNegotiation().select_parser(request, parsers)

    def select_renderer(
        self, request: Request, renderers: list[Any], format_suffix: str | None = None
    ) -> tuple[Any, str]:
        return renderers[0], renderers[0].media_type


class _BatchView(FreshConnectionView, APIView):
    renderer_classes = [JSONRenderer]
    parser_classes = [JSONParser]
    content_negotiation_class = AnyAccept


class FileList(_BatchView):
    parser_classes = [MultiPartParser, FormParser]

    def post(self, request: Request) -> Response:
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidRequest("Send the file as multipart form field 'file'.", param="file")
        purpose = request.data.get("purpose")
        if not isinstance(purpose, str):
            raise InvalidRequest("Send the form field 'purpose' ('batch').", param="purpose")
        created = batch_files.batch_file_create(
            principal=principal_of(request),
            filename=upload.name or "",
            purpose=purpose,
            content=upload.read(),
        )
        return Response(batch_files.batch_file_data(created))


class FileDetail(_BatchView):
    def get(self, request: Request, file_id: str) -> Response:
        found = batch_files.batch_file_get(
            tenant_id=principal_of(request).tenant_id, file_id=_file_id(file_id)
        )
        return Response(batch_files.batch_file_data(found))


class FileContent(_BatchView):
    def get(self, request: Request, file_id: str) -> HttpResponse:
        content = batch_files.batch_file_content(
            tenant_id=principal_of(request).tenant_id, file_id=_file_id(file_id)
        )
        return HttpResponse(content, content_type="application/jsonl")


class BatchList(_BatchView):
    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise InvalidRequest("The body must be a JSON object.")
        batch = batches.batch_create(
            principal=principal_of(request),
            input_file_id=data.get("input_file_id"),
            endpoint=data.get("endpoint"),
            completion_window=data.get("completion_window"),
            metadata=data.get("metadata"),
            now=timezone.now(),
        )
        return Response(batches.batch_data(batch))

    def get(self, request: Request) -> Response:
        after = request.query_params.get("after") or None
        if after is not None:
            _batch_id(after, param="after")
        found, more = batches.batches_list(
            tenant_id=principal_of(request).tenant_id, after=after, limit=_limit(request)
        )
        data = [batches.batch_data(batch) for batch in found]
        return Response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": more,
            }
        )


class BatchDetail(_BatchView):
    def get(self, request: Request, batch_id: str) -> Response:
        batch = batches.batch_get(
            tenant_id=principal_of(request).tenant_id, batch_id=_batch_id(batch_id)
        )
        return Response(batches.batch_data(batch))


class BatchCancel(_BatchView):
    def post(self, request: Request, batch_id: str) -> Response:
        batch = batches.batch_get(
            tenant_id=principal_of(request).tenant_id, batch_id=_batch_id(batch_id)
        )
        return Response(batches.batch_data(batches.batch_cancel(batch, timezone.now())))


def _file_id(value: str) -> str:
    if not batches.FILE_ID.fullmatch(value):
        raise InvalidRequest("Pass the id of a file: /v1/files/file-…", param="file_id")
    return value


def _batch_id(value: str, param: str = "batch_id") -> str:
    if not batches.BATCH_ID.fullmatch(value):
        raise InvalidRequest("Pass the id of a batch: batch_…", param=param)
    return value


def _limit(request: Request) -> int:
    smallest, largest, default = batches.LIST_LIMIT
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not smallest <= int(raw) <= largest:
        raise InvalidRequest(
            f"limit must be a whole number from {smallest} to {largest}.", param="limit"
        )
    return int(raw)
