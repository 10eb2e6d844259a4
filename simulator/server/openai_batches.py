"""OpenAI's Batch API on the simulator (E5): files and batches in OpenAI's shapes.

``POST /v1/files`` (multipart, purpose ``batch``), ``GET /v1/files/{id}``, ``GET
/v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``POST
/v1/batches/{id}/cancel``. A batch ends ``completed`` (or ``cancelled``) with an output file
(the lines answered 2xx) and an error file (the others), each line ``{id, custom_id, response:
{status_code, request_id, body}, error}``. Lines are answered by ``batches.BatchBook``.
"""

from __future__ import annotations

import email.parser
import email.policy
from dataclasses import dataclass
from typing import Any

import orjson

from simulator.server.batches import BatchBook, ProviderBatch
from simulator.server.common import BadRequest, Response, load_json_object, make_id
from simulator.server.openai_wire import OpenAIWire

ENDPOINT = "/v1/chat/completions"  # the only url the simulator's batches serve


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int


class OpenAIBatches:
    def __init__(self, book: BatchBook, wire: OpenAIWire) -> None:
        self.book = book
        self.wire = wire
        self.files: dict[str, StoredFile] = {}

    @staticmethod
    def handles(path: str) -> bool:
        return path.startswith(("/v1/files", "/v1/batches"))

    def serve(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        parts = path.strip("/").split("/")  # v1, files|batches, id, action
        try:
            if parts[1] == "files":
                return self._files(method, parts[2:], headers, body)
            return self._batches(method, parts[2:], headers, body)
        except BadRequest as error:
            return self.wire.bad_request(error)

    def reset(self) -> None:
        self.files.clear()

    # -- files -------------------------------------------------------------------------------

    def _files(
        self, method: str, rest: list[str], headers: dict[str, str], body: bytes
    ) -> Response:
        if not rest and method == "POST":
            return self._upload(headers, body)
        if not rest or method != "GET" or len(rest) > 2:
            return self._not_found()
        file = self.files.get(rest[0])
        if file is None:
            return self.wire.error(404, "invalid_request_error", f"No such File object: {rest[0]}")
        if len(rest) == 2 and rest[1] == "content":
            return Response(200, [], file.content, content_type="application/octet-stream")
        if len(rest) == 2:
            return self._not_found()
        return Response(200, [], orjson.dumps(self._file_data(file)))

    def _upload(self, headers: dict[str, str], body: bytes) -> Response:
        fields = _multipart(headers.get("content-type", ""), body)
        purpose = fields.get("purpose", (b"", ""))[0].decode()
        if purpose != "batch":
            raise BadRequest(f"Invalid value for 'purpose': {purpose!r}.", param="purpose")
        if "file" not in fields:
            raise BadRequest("Missing required parameter: 'file'.", param="file")
        content, filename = fields["file"]
        file = self._store(filename or "batch.jsonl", "batch", content)
        return Response(200, [], orjson.dumps(self._file_data(file)))

    def _store(self, filename: str, purpose: str, content: bytes) -> StoredFile:
        file = StoredFile(
            make_id(self.book.rng, "file-", 24),
            filename,
            purpose,
            content,
            int(self.book.clock()),
        )
        self.files[file.id] = file
        return file

    def _file_data(self, file: StoredFile) -> dict[str, Any]:
        return {
            "id": file.id,
            "object": "file",
            "bytes": len(file.content),
            "created_at": file.created_at,
            "filename": file.filename,
            "purpose": file.purpose,
            "status": "processed",
            "status_details": None,
        }

    # -- batches -----------------------------------------------------------------------------

    def _batches(
        self, method: str, rest: list[str], headers: dict[str, str], body: bytes
    ) -> Response:
        if not rest and method == "POST":
            return self._create(headers, body)
        if not rest or len(rest) > 2:
            return self._not_found()
        batch = self.book.get(rest[0])
        if batch is None:
            return self.wire.error(
                404, "invalid_request_error", f"No batch found with id '{rest[0]}'."
            )
        if len(rest) == 2 and rest[1] == "cancel" and method == "POST":
            self.book.cancel(batch)
        elif len(rest) == 2 or method != "GET":
            return self._not_found()
        return Response(200, [], orjson.dumps(self._batch_data(batch)))

    def _create(self, headers: dict[str, str], body: bytes) -> Response:
        data = load_json_object(body)
        if data.get("endpoint") != ENDPOINT:
            raise BadRequest(
                f"Invalid value for 'endpoint': must be '{ENDPOINT}'.", param="endpoint"
            )
        if data.get("completion_window") != "24h":
            raise BadRequest(
                "Invalid value for 'completion_window': must be '24h'.", param="completion_window"
            )
        file = self.files.get(str(data.get("input_file_id")))
        if file is None or file.purpose != "batch":
            raise BadRequest(
                "Invalid 'input_file_id': no batch file of that id.", param="input_file_id"
            )
        lines = _lines(file.content)
        batch = self.book.create(
            "batch_",
            lines,
            headers.get("idempotency-key") or None,
            input_file_id=file.id,
            metadata=data.get("metadata"),
        )
        return Response(200, [], orjson.dumps(self._batch_data(batch)))

    def _batch_data(self, batch: ProviderBatch) -> dict[str, Any]:
        ended = batch.ended_at is not None
        if ended and "output_file_id" not in batch.extra:
            self._files_write(batch)
        status = "in_progress"
        if ended:
            status = "cancelled" if batch.cancelled else "completed"
        elif batch.cancelled:
            status = "cancelling"

        def stamp(value: float | None) -> int | None:
            return int(value) if value is not None else None

        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": ENDPOINT,
            "errors": None,
            "input_file_id": batch.extra["input_file_id"],
            "completion_window": "24h",
            "status": status,
            "output_file_id": batch.extra.get("output_file_id"),
            "error_file_id": batch.extra.get("error_file_id"),
            "created_at": stamp(batch.created_at),
            "in_progress_at": stamp(batch.created_at),
            "expires_at": stamp(batch.created_at + 86_400),
            "finalizing_at": stamp(batch.ended_at) if ended and not batch.cancelled else None,
            "completed_at": stamp(batch.ended_at) if ended and not batch.cancelled else None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": stamp(batch.cancel_requested_at),
            "cancelled_at": stamp(batch.ended_at) if ended and batch.cancelled else None,
            "request_counts": {
                "total": len(batch.lines),
                "completed": batch.count(True),
                "failed": batch.count(False),
            },
            "metadata": batch.extra.get("metadata"),
        }

    def _files_write(self, batch: ProviderBatch) -> None:
        output: list[bytes] = []
        errors: list[bytes] = []
        for line in batch.lines[: batch.answered]:
            record = {
                "id": make_id(self.book.rng, "batch_req_", 32),
                "custom_id": line.custom_id,
                "response": {
                    "status_code": line.status,
                    "request_id": line.request_id,
                    "body": line.answer,
                },
                "error": None,
            }
            (output if line.status < 400 else errors).append(orjson.dumps(record))
        for kind, records in (("output", output), ("error", errors)):
            batch.extra[f"{kind}_file_id"] = None
            if records:
                content = b"\n".join(records) + b"\n"
                file = self._store(f"{batch.id}_{kind}.jsonl", "batch_output", content)
                batch.extra[f"{kind}_file_id"] = file.id

    def _not_found(self) -> Response:
        return self.wire.error(404, "invalid_request_error", "Invalid URL")


def _lines(content: bytes) -> list[tuple[str, bytes]]:
    """The file's ``(custom_id, body)`` lines; a line that is not a request is a 400."""
    lines: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise BadRequest(
                f"Line {number} of the input file is not JSON.", param="input_file_id"
            ) from None
        custom_id = data.get("custom_id") if isinstance(data, dict) else None
        body = data.get("body") if isinstance(data, dict) else None
        if not isinstance(custom_id, str) or custom_id in seen or not isinstance(body, dict):
            raise BadRequest(
                f"Line {number} of the input file needs a unique custom_id and a body.",
                param="input_file_id",
            )
        if data.get("url") != ENDPOINT:
            raise BadRequest(f"Line {number}: url must be '{ENDPOINT}'.", param="input_file_id")
        seen.add(custom_id)
        lines.append((custom_id, orjson.dumps(body)))
    if not lines:
        raise BadRequest("The input file holds no request.", param="input_file_id")
    return lines


def _multipart(content_type: str, body: bytes) -> dict[str, tuple[bytes, str]]:
    """The form's fields of a ``multipart/form-data`` body: name → (bytes, filename)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise BadRequest("The upload must be multipart/form-data.", param="file")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    fields: dict[str, tuple[bytes, str]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            data = payload if isinstance(payload, bytes) else b""
            fields[name] = (data, part.get_filename() or "")
    return fields
