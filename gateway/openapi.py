"""The proxy's request contract as an OpenAPI 3.1 document, served at ``GET /v1/openapi.json``.

Written by hand: the proxy's views are plain async Django views (``views.py``) and its body is
checked by ``validation.py``, so no generator sees the contract whole. The bounds and choices
come from the modules that enforce them, and ``tests/gateway/test_openapi.py`` walks the
validator's serializers and fails when this document and the validator disagree on a field,
a required name, an enum or a bound.

What the document promises about answers: every error status of every operation carries the
envelope of ``errors.py`` (``ErrorEnvelope``), its ``type`` one of the error classes' types.
Fields the gateway does not know are passed through to providers, so request objects are open
(no ``additionalProperties: false``).
"""

from __future__ import annotations

from functools import cache

import orjson

from gateway import errors, idempotency, jobs
from gateway.models import Job
from gateway.openapi_batches import BATCH_PATHS, BATCH_SCHEMAS
from gateway.openapi_embeddings import EMBEDDINGS, EMBEDDINGS_REQUEST, embeddings_path
from gateway.openapi_messages import MESSAGES_PATHS, MESSAGES_SCHEMAS
from gateway.openapi_request import (
    CHAT_REQUEST,
    CONTENT_PART,
    MESSAGE,
    PERCENTILES,
    PROVIDER_PREFERENCES,
    STRING,
    TOOL,
    TOOL_CALL,
    Schema,
    schema_ref,
)
from gateway.openapi_responses import RESPONSE, RESPONSE_DELETED, RESPONSE_REQUEST

ERROR_DESCRIPTIONS = {
    400: "Malformed or invalid request: bad JSON, a wrong type, a value out of range, a bad "
    "header, or no endpoint can serve it.",
    401: "Missing, unknown, revoked or expired API key.",
    403: "The key may not use this model or workload class.",
    404: "No such model, record or endpoint.",
    409: "Idempotency-Key in flight or not replayable; a job or batch that can no longer be "
    "cancelled.",
    413: "Request body over MAX_REQUEST_BODY_BYTES.",
    422: "Idempotency-Key already used with another body.",
    429: "Refused for capacity (the caller's limits, or every provider's); see Retry-After.",
    500: "A bug; the envelope all the same.",
    502: "The provider failed or could not be reached.",
    503: "Switchyard or the provider account cannot serve now; see Retry-After.",
    504: "The provider did not answer in time.",
}


def _error_types() -> list[str]:
    """Every ``type`` an error envelope can carry: those of the classes in ``errors.py``."""
    seen: set[str] = set()
    pending: list[type[errors.GatewayError]] = [errors.GatewayError]
    while pending:
        cls = pending.pop()
        seen.add(cls.type)
        pending.extend(cls.__subclasses__())
    return sorted(seen)


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Schema]:
    # 500 on every operation: a bug, but still answered in the envelope (views.server_error).
    return {
        str(status): {"$ref": f"#/components/responses/Error{status}"}
        for status in sorted({*statuses, 500})
    }


def _header(name: str) -> Schema:
    return {"$ref": f"#/components/parameters/{name}"}


ERROR_ENVELOPE: Schema = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code", "param", "reason"],
            "additionalProperties": False,
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"enum": _error_types()},
                "code": {"type": "string", "minLength": 1},
                "param": {"type": ["string", "null"]},
                "reason": {"type": "string", "minLength": 1},
            },
        }
    },
}
COMPLETION: Schema = {
    "type": "object",
    "required": ["id", "object", "choices", "provider", "usage"],
    "properties": {
        "id": STRING,
        "object": {"const": "chat.completion"},
        "created": {"type": "integer"},
        "model": STRING,
        "provider": STRING,
        "choices": {"type": "array", "items": {"type": "object"}},
        "usage": {
            "type": "object",
            "required": ["cost"],
            "properties": {
                "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
                "cost": {"type": "number"},
            },
        },
    },
}
JOB: Schema = {
    "type": "object",
    "required": ["id", "object", "status", "model", "workload", "created_at", "generation_id"],
    "properties": {
        "id": STRING,
        "object": {"const": "chat.completion.job"},
        "status": {"enum": list(Job.Status.values)},
        "model": STRING,
        "workload": STRING,
        "created_at": {"type": "integer"},
        "deadline_at": {"type": "integer"},
        "finished_at": {"type": ["integer", "null"]},
        "tries": {"type": "integer"},
        "generation_id": STRING,
        "response": {
            "type": ["object", "null"],
            "description": "Once finished: {status_code, headers, body} of the answer or error.",
        },
    },
}
MODEL: Schema = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": STRING,
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": STRING,
        "canonical_slug": {**STRING, "description": "The model an alias stands for."},
        "aliases": {"type": "array", "items": STRING, "description": "Other ids it answers to."},
    },
}
GENERATION: Schema = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "object",
            "required": ["id", "model", "status", "total_cost"],
            "properties": {
                "id": STRING,
                "model": STRING,
                "status": {"type": "integer"},
                "total_cost": {"type": "number"},
                "reason_code": {"type": ["string", "null"]},
                "attempts": {"type": "integer"},
            },
        }
    },
}

PARAMETERS: dict[str, Schema] = {
    "IdempotencyKey": {
        "name": idempotency.HEADER,
        "in": "header",
        "required": False,
        "description": "The request reaches a provider once; a repeat gets the same answer "
        "(Idempotent-Replayed: true). Printable ASCII; a UUID is a good key.",
        "schema": {
            "type": "string",
            "maxLength": idempotency.MAX_KEY_LENGTH,
            "pattern": "^[ -~]*$",
        },
    },
    "Prefer": {
        "name": "Prefer",
        "in": "header",
        "required": False,
        "description": f"'{jobs.PREFER_ASYNC}' (RFC 7240): for a workload class that defers, "
        "202 Accepted with Location: /v1/jobs/{id}. Other preferences are ignored.",
        "schema": {"type": "string", "examples": [jobs.PREFER_ASYNC]},
    },
    "Workload": {
        "name": "X-Switchyard-Workload",
        "in": "header",
        "required": False,
        "description": "A workload class no heavier than the app's default (400 for an unknown "
        "class, 403 for a heavier one).",
        "schema": {"type": "string", "examples": ["interactive", "background", "batch"]},
    },
    "SessionId": {
        "name": "X-Session-Id",
        "in": "header",
        "required": False,
        "description": "Names a conversation for cache-aware stickiness (G12).",
        "schema": {"type": "string"},
    },
}

RETRY_AFTER: Schema = {
    "Retry-After": {"description": "Seconds until a retry may succeed.", "schema": STRING}
}


def _error_response(status: int) -> Schema:
    response = _json(schema_ref("ErrorEnvelope"), ERROR_DESCRIPTIONS[status])
    if status in (429, 503):
        response["headers"] = RETRY_AFTER
    return response


def _document() -> Schema:
    bearer = [{"apiKey": []}]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchyard proxy API",
            "version": "1",
            "description": "OpenAI-compatible chat completions through Switchyard's rate-limit "
            "broker and router. Every error answers in one envelope: "
            '{"error": {message, type, code, param, reason}}.',
        },
        "security": bearer,
        "paths": {
            "/v1/chat/completions": {
                "post": {
                    "operationId": "chatCompletionCreate",
                    "parameters": [
                        _header(name) for name in ("IdempotencyKey", "Prefer", "Workload")
                    ]
                    + [_header("SessionId")],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": schema_ref("ChatCompletionRequest")}
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "The answer (stream: true: server-sent events).",
                            "content": {
                                "application/json": {"schema": schema_ref("ChatCompletion")},
                                "text/event-stream": {"schema": STRING},
                            },
                        },
                        "202": _json(schema_ref("Job"), "Deferred (Prefer: respond-async): a job."),
                        **_errors(400, 401, 403, 404, 409, 413, 422, 429, 502, 503, 504),
                    },
                }
            },
            "/v1/embeddings": embeddings_path(
                _errors(400, 401, 403, 404, 409, 413, 422, 429, 502, 503, 504),
                [_header(name) for name in ("IdempotencyKey", "Prefer", "Workload")],
            ),
            "/v1/responses": {
                "post": {
                    "operationId": "responseCreate",
                    "description": "OpenAI's Responses API on the same spine as chat "
                    "completions; store (on by default) keeps the answer for GET and for a "
                    "later turn's previous_response_id.",
                    "parameters": [
                        _header(name) for name in ("IdempotencyKey", "Prefer", "Workload")
                    ]
                    + [_header("SessionId")],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": schema_ref("ResponseCreateRequest")}
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "The Response (stream: true: its server-sent events).",
                            "content": {
                                "application/json": {"schema": schema_ref("Response")},
                                "text/event-stream": {"schema": STRING},
                            },
                        },
                        "202": _json(schema_ref("Job"), "Deferred (Prefer: respond-async): a job."),
                        **_errors(400, 401, 403, 404, 409, 413, 422, 429, 502, 503, 504),
                    },
                }
            },
            "/v1/responses/{response_id}": {
                "parameters": [
                    {
                        "name": "response_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "examples": ["resp_0123456789abcdef"]},
                    }
                ],
                "get": {
                    "operationId": "responseRetrieve",
                    "responses": {
                        "200": _json(schema_ref("Response"), "A stored response of this app."),
                        **_errors(400, 401, 404, 503),
                    },
                },
                "delete": {
                    "operationId": "responseDelete",
                    "responses": {
                        "200": _json(schema_ref("ResponseDeleted"), "Deleted."),
                        **_errors(400, 401, 404, 503),
                    },
                },
            },
            "/v1/models": {
                "get": {
                    "operationId": "modelsList",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["object", "data"],
                                "properties": {
                                    "object": {"const": "list"},
                                    "data": {"type": "array", "items": schema_ref("Model")},
                                },
                            },
                            "The models this key may use.",
                        ),
                        **_errors(401, 503),
                    },
                }
            },
            "/v1/models/{model_id}": {
                "get": {
                    "operationId": "modelRetrieve",
                    "parameters": [
                        {
                            "name": "model_id",
                            "in": "path",
                            "required": True,
                            "description": "A model id; its '/' may be sent as it is.",
                            "schema": {"type": "string", "examples": ["acme/chat-small"]},
                        }
                    ],
                    "responses": {
                        "200": _json(schema_ref("Model"), "One model this key may use."),
                        **_errors(401, 404, 503),
                    },
                }
            },
            "/v1/generation": {
                "get": {
                    "operationId": "generationRetrieve",
                    "parameters": [
                        {
                            "name": "id",
                            "in": "query",
                            "required": True,
                            "schema": {
                                "type": "string",
                                "pattern": "^gen-[A-Za-z0-9_-]+$",
                                "maxLength": 40,
                            },
                        }
                    ],
                    "responses": {
                        "200": _json(schema_ref("Generation"), "The stored record of one request."),
                        **_errors(400, 401, 404, 503),
                    },
                }
            },
            "/v1/jobs/{job_id}": {
                "parameters": [
                    {
                        "name": "job_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "examples": ["job-0123456789abcdef"]},
                    }
                ],
                "get": {
                    "operationId": "jobRetrieve",
                    "responses": {
                        "200": _json(
                            schema_ref("Job"), "The job's state, and its answer once done."
                        ),
                        **_errors(401, 404, 503),
                    },
                },
                "delete": {
                    "operationId": "jobCancel",
                    "responses": {
                        "200": _json(schema_ref("Job"), "Cancelled."),
                        **_errors(401, 404, 409, 503),
                    },
                },
            },
            "/v1/openapi.json": {
                "get": {
                    "operationId": "openapiRetrieve",
                    "security": [],
                    "responses": {
                        "200": _json({"type": "object"}, "This document."),
                        **_errors(),
                    },
                }
            },
            **MESSAGES_PATHS,
            **BATCH_PATHS,
        },
        "components": {
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key: 'Authorization: Bearer sk-sy-…'.",
                }
            },
            "parameters": PARAMETERS,
            "schemas": {
                "ChatCompletionRequest": CHAT_REQUEST,
                "Message": MESSAGE,
                "ContentPart": CONTENT_PART,
                "ToolCall": TOOL_CALL,
                "Tool": TOOL,
                "ProviderPreferences": PROVIDER_PREFERENCES,
                "Percentiles": PERCENTILES,
                "ChatCompletion": COMPLETION,
                "EmbeddingsRequest": EMBEDDINGS_REQUEST,
                "Embeddings": EMBEDDINGS,
                "ResponseCreateRequest": RESPONSE_REQUEST,
                "Response": RESPONSE,
                "ResponseDeleted": RESPONSE_DELETED,
                "Job": JOB,
                "Model": MODEL,
                "Generation": GENERATION,
                "ErrorEnvelope": ERROR_ENVELOPE,
                **MESSAGES_SCHEMAS,
                **BATCH_SCHEMAS,
            },
            "responses": {
                f"Error{status}": _error_response(status) for status in ERROR_DESCRIPTIONS
            },
        },
    }


def openapi_document() -> Schema:
    """A fresh copy of the document (callers may change theirs)."""
    return orjson.loads(openapi_json())  # type: ignore[no-any-return]


@cache
def openapi_json() -> bytes:
    return orjson.dumps(_document())
