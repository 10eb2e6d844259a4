"""The contract of ``POST /v1/embeddings`` (``gateway/doors/embeddings.py``) for the OpenAPI
document (``gateway/openapi.py``): what the door accepts, and its answer."""

from __future__ import annotations

from gateway.doors.embeddings import ENCODINGS, MAX_INPUTS, MAX_TOKEN_ID
from gateway.openapi_request import STRING, Schema, schema_ref

TOKEN: Schema = {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}
TEXT: Schema = {"type": "string", "minLength": 1}

EMBEDDINGS_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "A model whose endpoints embed (GET /v1/models), or an alias of one.",
            "examples": ["acme/embed-small"],
        },
        "input": {
            "description": "Text or token ids; a batch is embedded in order. Token ids are "
            "counted exactly, text is estimated.",
            "oneOf": [
                TEXT,
                {"type": "array", "items": TEXT, "minItems": 1, "maxItems": MAX_INPUTS},
                {"type": "array", "items": TOKEN, "minItems": 1},
                {
                    "type": "array",
                    "items": {"type": "array", "items": TOKEN, "minItems": 1},
                    "minItems": 1,
                    "maxItems": MAX_INPUTS,
                },
            ],
        },
        "dimensions": {"type": ["integer", "null"], "minimum": 1},
        "encoding_format": {"enum": [*ENCODINGS, None]},
        "user": {"type": ["string", "null"], "maxLength": 256},
        "provider": schema_ref("ProviderPreferences"),
        "models": {
            "type": ["array", "null"],
            "items": {"type": "string", "minLength": 1},
            "maxItems": 8,
        },
        "stream": {"enum": [False, None], "description": "Embeddings are answered whole."},
    },
}

EMBEDDINGS: Schema = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {
                        "description": "Floats, or base64 of little-endian float32s.",
                        "oneOf": [{"type": "array", "items": {"type": "number"}}, STRING],
                    },
                },
            },
        },
        "model": STRING,
        "provider": STRING,
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "total_tokens"],
            "properties": {
                "prompt_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
                "cost": {"type": "number"},
            },
        },
    },
}


def embeddings_path(errors: Schema, headers: list[Schema]) -> Schema:
    """The path item of ``/v1/embeddings`` with the document's own error responses and
    headers (the same as chat's: idempotency, deferral, workload)."""
    return {
        "post": {
            "operationId": "embeddingsCreate",
            "parameters": headers,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": schema_ref("EmbeddingsRequest")}},
            },
            "responses": {
                "200": {
                    "description": "One vector per input, in order, with the batch's usage.",
                    "content": {"application/json": {"schema": schema_ref("Embeddings")}},
                },
                "202": {
                    "description": "Deferred (Prefer: respond-async): a job.",
                    "content": {"application/json": {"schema": schema_ref("Job")}},
                },
                **errors,
            },
        }
    }
