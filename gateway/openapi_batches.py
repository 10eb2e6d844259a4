"""The contract of the Batch API (``gateway/batches_api.py``, E5) for the OpenAPI document
(``gateway/openapi.py``): ``/v1/files`` and ``/v1/batches``, in OpenAI's shapes."""

from __future__ import annotations

from gateway.batch_files import BATCH_DOORS, MAX_CUSTOM_ID
from gateway.batch_models import Batch
from gateway.batches import COMPLETION_WINDOWS, LIST_LIMIT, MAX_METADATA
from gateway.openapi_request import STRING, Schema, schema_ref

INTEGER: Schema = {"type": "integer"}
STAMP: Schema = {"type": ["integer", "null"], "description": "Unix seconds, or null."}


def _errors(*statuses: int) -> dict[str, Schema]:
    return {
        str(status): {"$ref": f"#/components/responses/Error{status}"}
        for status in sorted({*statuses, 500})
    }


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _id(name: str, example: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "examples": [example]},
    }


BATCH_FILE: Schema = {
    "type": "object",
    "required": ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
    "properties": {
        "id": STRING,
        "object": {"const": "file"},
        "bytes": INTEGER,
        "created_at": INTEGER,
        "filename": STRING,
        "purpose": {"enum": ["batch", "batch_output"]},
        "status": {"const": "processed"},
        "status_details": {"type": "null"},
        "expires_at": {"type": "null"},
    },
}

BATCH: Schema = {
    "type": "object",
    "required": ["id", "object", "endpoint", "status", "input_file_id", "request_counts"],
    "properties": {
        "id": STRING,
        "object": {"const": "batch"},
        "endpoint": {"enum": list(BATCH_DOORS)},
        "errors": {
            "type": ["object", "null"],
            "description": "Why a batch failed validating: {object: list, data: [{code, "
            "message, param, line}]}.",
        },
        "input_file_id": STRING,
        "completion_window": {"enum": list(COMPLETION_WINDOWS)},
        "status": {"enum": [status.value for status in Batch.Status]},
        "output_file_id": {"type": ["string", "null"]},
        "error_file_id": {"type": ["string", "null"]},
        **{
            f"{stamp}_at": STAMP
            for stamp in (
                "created",
                "in_progress",
                "expires",
                "finalizing",
                "completed",
                "failed",
                "expired",
                "cancelling",
                "cancelled",
            )
        },
        "request_counts": {
            "type": "object",
            "required": ["total", "completed", "failed"],
            "properties": {"total": INTEGER, "completed": INTEGER, "failed": INTEGER},
        },
        "metadata": {"type": ["object", "null"]},
    },
}

BATCH_CREATE: Schema = {
    "type": "object",
    "required": ["input_file_id", "endpoint", "completion_window"],
    "properties": {
        "input_file_id": {"type": "string", "description": "A file of purpose 'batch'."},
        "endpoint": {"enum": list(BATCH_DOORS), "description": "Every line's url."},
        "completion_window": {"enum": list(COMPLETION_WINDOWS)},
        "metadata": {
            "type": ["object", "null"],
            "description": "Up to 16 string pairs, kept with the batch. "
            "'switchyard_batch_path': 'lines' keeps the lines here, one by one, even when an "
            "endpoint of their model offers a provider batch API.",
            "maxProperties": MAX_METADATA,
            "propertyNames": {"maxLength": 64},
            "additionalProperties": {"type": "string", "maxLength": 512},
        },
    },
}

FILE_UPLOAD: Schema = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "purpose": {"const": "batch"},
        "file": {
            "type": "string",
            "format": "binary",
            "description": "JSONL, one request a line: {custom_id (unique, at most "
            f"{MAX_CUSTOM_ID} characters), method: POST, url: one of {', '.join(BATCH_DOORS)}, "
            "body: the request (a model, no stream)}. A line that breaks a rule refuses the "
            "whole file with a 400 naming the line (param 'file', code e.g. "
            "duplicate_custom_id, invalid_url, invalid_json_line).",
        },
    },
}

BATCH_PATHS: Schema = {
    "/v1/files": {
        "post": {
            "operationId": "fileCreate",
            "description": "Upload a batch's input file (multipart/form-data).",
            "requestBody": {
                "required": True,
                "content": {"multipart/form-data": {"schema": FILE_UPLOAD}},
            },
            "responses": {
                "200": _json(schema_ref("BatchFile"), "The stored file."),
                **_errors(400, 401, 413, 503),
            },
        }
    },
    "/v1/files/{file_id}": {
        "parameters": [_id("file_id", "file-0123456789abcdef01234567")],
        "get": {
            "operationId": "fileRetrieve",
            "responses": {
                "200": _json(schema_ref("BatchFile"), "The file, if it is the tenant's."),
                **_errors(400, 401, 404, 503),
            },
        },
    },
    "/v1/files/{file_id}/content": {
        "parameters": [_id("file_id", "file-0123456789abcdef01234567")],
        "get": {
            "operationId": "fileContent",
            "description": "The file's bytes: an input file as uploaded; an output or error "
            "file one JSON object a line, {id, custom_id, response: {status_code, request_id, "
            "body} | null, error: {code, message} | null}.",
            "responses": {
                "200": {
                    "description": "JSONL.",
                    "content": {"application/jsonl": {"schema": STRING}},
                },
                **_errors(400, 401, 404, 503),
            },
        },
    },
    "/v1/batches": {
        "post": {
            "operationId": "batchCreate",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": schema_ref("BatchCreateRequest")}},
            },
            "responses": {
                "200": _json(schema_ref("Batch"), "The batch, validating."),
                **_errors(400, 401, 404, 503),
            },
        },
        "get": {
            "operationId": "batchList",
            "parameters": [
                {
                    "name": "after",
                    "in": "query",
                    "schema": STRING,
                    "description": "The id of the last batch of the previous page.",
                },
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {
                        "type": "integer",
                        "minimum": LIST_LIMIT[0],
                        "maximum": LIST_LIMIT[1],
                        "default": LIST_LIMIT[2],
                    },
                },
            ],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "object": {"const": "list"},
                            "data": {"type": "array", "items": schema_ref("Batch")},
                            "first_id": {"type": ["string", "null"]},
                            "last_id": {"type": ["string", "null"]},
                            "has_more": {"type": "boolean"},
                        },
                    },
                    "The tenant's batches, newest first.",
                ),
                **_errors(400, 401, 404, 503),
            },
        },
    },
    "/v1/batches/{batch_id}": {
        "parameters": [_id("batch_id", "batch_0123456789abcdef01234567")],
        "get": {
            "operationId": "batchRetrieve",
            "responses": {
                "200": _json(schema_ref("Batch"), "The batch, if it is the tenant's."),
                **_errors(400, 401, 404, 503),
            },
        },
    },
    "/v1/batches/{batch_id}/cancel": {
        "parameters": [_id("batch_id", "batch_0123456789abcdef01234567")],
        "post": {
            "operationId": "batchCancel",
            "description": "Lines not yet run are not run; running ones finish; then the batch "
            "is cancelled, with the answers it has in its output file.",
            "responses": {
                "200": _json(schema_ref("Batch"), "The batch, cancelling."),
                **_errors(400, 401, 404, 409, 503),
            },
        },
    },
}

BATCH_SCHEMAS: Schema = {
    "BatchFile": BATCH_FILE,
    "Batch": BATCH,
    "BatchCreateRequest": BATCH_CREATE,
}
