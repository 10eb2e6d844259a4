"""E5: ``POST /v1/files`` — a batch's input file (JSONL), checked line by line as it arrives.

Each line is one request: ``{"custom_id": …, "method": "POST", "url": …, "body": {…}}``, the
``custom_id`` unique in the file, the ``url`` one of ``BATCH_DOORS``. A file that breaks a rule
is refused whole with a 400 that names the line (1-based) and the rule, so nothing half-checked
is ever stored; a stored file's lines are therefore safe to run as they are.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.db.models import QuerySet

from gateway.batch_models import BatchFile
from gateway.errors import BodyTooLarge, InvalidRequest, NotFound
from gateway.jobs import nul_path
from tenants.identity import Principal

# The Batch API's urls and the door that serves each (gateway/doors).
BATCH_DOORS = {
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
MAX_CUSTOM_ID = 512  # characters, as Job.custom_id keeps them


@dataclass(frozen=True)
class BatchLine:
    line: int  # 1-based, as the file's error messages count
    custom_id: str
    url: str
    body: dict[str, Any]


def batch_file_create(
    *, principal: Principal, filename: str, purpose: str, content: bytes
) -> BatchFile:
    """Check the upload and store it; a bad one raises ``InvalidRequest`` naming the line."""
    if purpose != BatchFile.Purpose.BATCH:
        raise InvalidRequest(
            f"purpose must be 'batch' (got {purpose!r}): only batch input files are kept.",
            param="purpose",
            code="invalid_value",
        )
    if len(content) > settings.BATCH_FILE_MAX_BYTES:
        raise BodyTooLarge(
            f"A batch file may hold at most {settings.BATCH_FILE_MAX_BYTES} bytes.", param="file"
        )
    lines = batch_lines_parse(content)
    return BatchFile.objects.create(
        id=f"file-{uuid.uuid4().hex[:24]}",
        tenant_id=principal.tenant_id,
        app_id=principal.app_id,
        api_key_id=principal.key_id,
        purpose=purpose,
        filename=filename[:255] or "batch.jsonl",
        bytes=len(content),
        lines=len(lines),
        content=content,
    )


def batch_lines_parse(content: bytes) -> list[BatchLine]:
    """The file's requests; every rule broken is a 400 naming its line."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(None, "the file is not UTF-8 text.", "invalid_file_encoding") from exc
    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue  # a trailing newline, a blank line: nothing to run
        line = _line_parse(number, raw)
        if line.custom_id in seen:
            raise _bad(
                number,
                f"custom_id {line.custom_id!r} repeats an earlier line's.",
                "duplicate_custom_id",
            )
        seen.add(line.custom_id)
        lines.append(line)
        if len(lines) > settings.BATCH_MAX_LINES:
            raise _bad(
                None,
                f"a batch holds at most {settings.BATCH_MAX_LINES} requests.",
                "too_many_requests",
            )
    if not lines:
        raise _bad(None, "the file holds no request.", "empty_file")
    return lines


def _line_parse(number: int, raw: str) -> BatchLine:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(number, "not a JSON object.", "invalid_json_line") from exc
    if not isinstance(data, dict):
        raise _bad(number, "not a JSON object.", "invalid_json_line")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _bad(number, "custom_id must be a non-empty string.", "missing_custom_id")
    if len(custom_id) > MAX_CUSTOM_ID or "\x00" in custom_id:
        raise _bad(
            number,
            f"custom_id must be at most {MAX_CUSTOM_ID} characters, without NUL.",
            "invalid_custom_id",
        )
    if data.get("method") != "POST":
        raise _bad(number, "method must be 'POST'.", "invalid_method")
    url = data.get("url")
    if not isinstance(url, str) or url not in BATCH_DOORS:  # a list is unhashable
        raise _bad(
            number, f"url must be one of {', '.join(BATCH_DOORS)} (got {url!r}).", "invalid_url"
        )
    body = data.get("body")
    if not isinstance(body, dict):
        raise _bad(number, "body must be a JSON object (the request).", "invalid_body")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad(number, "body.model must name a model.", "invalid_body")
    if body.get("stream"):
        raise _bad(number, "a batch request cannot stream; drop body.stream.", "invalid_body")
    path = nul_path(body, "")
    if path is not None:  # PostgreSQL keeps no NUL in jsonb: refused now, not as it is stored
        raise _bad(
            number, f"body.{path or ''}: NUL characters (\\u0000) cannot be kept.", "invalid_body"
        )
    return BatchLine(line=number, custom_id=custom_id, url=url, body=body)


def _bad(line: int | None, message: str, code: str) -> InvalidRequest:
    where = f"Line {line} of the batch file: " if line is not None else "Batch file: "
    return InvalidRequest(where + message, param="file", code=code)


def batch_files_own(tenant_id: int) -> QuerySet[BatchFile]:
    return BatchFile.objects.filter(tenant_id=tenant_id)


def batch_file_get(*, tenant_id: int, file_id: str) -> BatchFile:
    """The tenant's file; any other id, another tenant's included, is the same 404."""
    found = batch_files_own(tenant_id).filter(pk=file_id).defer("content").first()
    if found is None:
        raise NotFound(f"No file {file_id}.", param="file_id")
    return found


def batch_file_content(*, tenant_id: int, file_id: str) -> bytes:
    content = batch_files_own(tenant_id).filter(pk=file_id).values_list("content", flat=True)
    found = content.first()
    if found is None:
        raise NotFound(f"No file {file_id}.", param="file_id")
    return bytes(found)


def batch_file_data(file: BatchFile) -> dict[str, Any]:
    """A file as OpenAI's API shows one."""
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at.timestamp()),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }
