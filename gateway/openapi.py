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
from typing import Any

import orjson

from gateway import errors, idempotency, jobs, validation
from gateway.models import Job
from gateway.validation import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, ROLES

Schema = dict[str, Any]
PERCENTILE_KEYS = ("p50", "p75", "p90", "p99")

ERROR_DESCRIPTIONS = {
    400: "Malformed or invalid request: bad JSON, a wrong type, a value out of range, a bad "
    "header, or no endpoint can serve it.",
    401: "Missing, unknown, revoked or expired API key.",
    403: "The key may not use this model or workload class.",
    404: "No such model, record or endpoint.",
    409: "Idempotency-Key in flight or not replayable; a job that can no longer be cancelled.",
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


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


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


STRING: Schema = {"type": "string"}
# What Python's str.strip() removes (every str.isspace() character), as DRF's CharField trims;
# ECMA-262's \s, which a schema's pattern means, is another set.
BLANK = r"\t-\r\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# DRF's CharField (validation.StrictCharField): no NUL, and not blank once trimmed.
NAME: Schema = {"type": "string", "pattern": f"^[^\\u0000]*[^{BLANK}\\u0000][^\\u0000]*$"}
NO_NUL: Schema = {"type": "string", "pattern": r"^[^\u0000]*$"}
# Schemas are written without not/if/anyOf where a oneOf of disjoint cases says the same: a
# generator builds those cases directly instead of drawing and throwing most away.
CONTENT_PART: Schema = {
    "oneOf": [
        {
            "type": "object",
            "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": NO_NUL},
        },
        {
            "type": "object",
            "required": ["type"],
            "description": "Carries what its provider expects (image_url, input_audio, file).",
            "properties": {"type": {"enum": ["image_url", "input_audio", "file"]}, "text": NO_NUL},
        },
    ]
}
CONTENT: Schema = {
    "oneOf": [
        STRING,
        {"type": "array", "items": _ref("ContentPart"), "maxItems": MAX_CONTENT_PARTS},
    ]
}
TOOL_CALL: Schema = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": NAME,
        "type": {"enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": NAME, "arguments": NO_NUL},
        },
    },
}
TOOL_CALLS: Schema = {"type": "array", "items": _ref("ToolCall"), "minItems": 1}
# One schema per case of the validator's cross-field rules: content is required except on an
# assistant message that calls tools; only assistants call tools; a tool message names the call
# it answers. (``false``: the field must be absent.)
MESSAGE: Schema = {
    "oneOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"enum": [r for r in ROLES if r not in ("assistant", "tool")]},
                "content": CONTENT,
                "name": NAME,
                "tool_call_id": NAME,
                "tool_calls": False,
            },
        },
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"const": "assistant"},
                "content": CONTENT,
                "name": NAME,
                "tool_calls": TOOL_CALLS,
                "tool_call_id": NAME,
            },
        },
        {
            "type": "object",
            "required": ["role", "tool_calls"],
            "properties": {
                "role": {"const": "assistant"},
                "content": {"type": "null"},
                "name": NAME,
                "tool_calls": TOOL_CALLS,
                "tool_call_id": NAME,
            },
        },
        {
            "type": "object",
            "required": ["role", "content", "tool_call_id"],
            "properties": {
                "role": {"const": "tool"},
                "content": CONTENT,
                "name": NAME,
                "tool_call_id": NAME,
                "tool_calls": False,
            },
        },
    ]
}
TOOL: Schema = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {**NAME, "maxLength": 64},
                "description": NO_NUL,
                "parameters": {
                    "type": "object",
                    "description": f"a JSON Schema of at most {validation.MAX_SCHEMA_BYTES} bytes",
                },
                "strict": {"type": "boolean"},
            },
        },
    },
}
PROVIDER_PREFERENCES: Schema = {
    "type": "object",
    "description": (
        "OpenRouter-compatible routing overrides (SPEC G13), "
        f"at most {validation.MAX_PROVIDER_BYTES} bytes of JSON."
    ),
    "properties": {
        "order": {"type": ["array", "null"], "items": STRING},
        "only": {"type": ["array", "null"], "items": STRING},
        "ignore": {"type": ["array", "null"], "items": STRING},
        "allow_fallbacks": {"type": "boolean"},
        "require_parameters": {"type": "boolean"},
        "sort": {
            "oneOf": [
                {"enum": ["price", "throughput", "latency", None]},
                {
                    "type": "object",
                    "properties": {
                        "by": {"enum": ["price", "throughput", "latency", None]},
                        "partition": {"enum": ["model", "none"]},
                    },
                },
            ]
        },
        "max_price": {
            "type": ["object", "null"],
            "properties": {
                "prompt": {"type": ["number", "null"], "minimum": 0},
                "completion": {"type": ["number", "null"], "minimum": 0},
            },
        },
        "preferred_min_throughput": _ref("Percentiles"),
        "preferred_max_latency": _ref("Percentiles"),
    },
}
# A number (the p50), or percentiles of which the first given is compared (p50 first).
PERCENTILES: Schema = {
    "oneOf": [
        {"type": ["number", "null"], "minimum": 0},
        {
            "type": "object",
            "properties": {p: {"type": ["number", "null"], "minimum": 0} for p in PERCENTILE_KEYS},
            "anyOf": [
                {"required": [p], "properties": {p: {"type": "number"}}} for p in PERCENTILE_KEYS
            ],
        },
    ]
}
CHAT_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {
            **NAME,
            "maxLength": 200,
            "description": "A model id of GET /v1/models; ':floor' sorts by price, "
            "':nitro' by throughput.",
            "examples": ["acme/chat-small"],
        },
        "messages": {
            "type": "array",
            "items": _ref("Message"),
            "minItems": 1,
            "maxItems": MAX_MESSAGES,
        },
        "stream": {"type": "boolean"},
        "stream_options": {
            "type": "object",
            "properties": {"include_usage": {"type": "boolean"}},
            "description": "Only with stream: true.",
        },
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "n": {"type": "integer", "minimum": 1, "maximum": 1},
        "stop": {
            "oneOf": [
                STRING,
                {"type": "array", "items": STRING, "maxItems": 4},
                {"type": "null"},
            ]
        },
        "tools": {"type": "array", "items": _ref("Tool"), "maxItems": MAX_TOOLS},
        "tool_choice": {
            "oneOf": [
                {"enum": ["none", "auto", "required", None]},
                {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"const": "function"},
                        "function": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": STRING},
                        },
                    },
                },
            ]
        },
        "user": {**NAME, "maxLength": 256},
        "metadata": {
            "type": ["object", "null"],
            "maxProperties": validation.MAX_METADATA_PAIRS,
            "propertyNames": {"maxLength": validation.MAX_METADATA_KEY},
            "additionalProperties": {"type": "string", "maxLength": validation.MAX_METADATA_VALUE},
        },
        "response_format": {
            "type": "object",
            "description": (
                "{type: text | json_object | json_schema, json_schema: …}, "
                f"at most {validation.MAX_SCHEMA_BYTES} bytes of JSON"
            ),
        },
        "parallel_tool_calls": {"type": "boolean"},
        "provider": _ref("ProviderPreferences"),
        "models": {
            "type": "array",
            "items": NAME,
            "maxItems": 8,
            "description": "Fallback models, tried after model.",
        },
    },
    # stream_options without stream (or with stream: false) is refused.
    "dependentSchemas": {
        "stream_options": {"required": ["stream"], "properties": {"stream": {"const": True}}}
    },
}
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
    response = _json(_ref("ErrorEnvelope"), ERROR_DESCRIPTIONS[status])
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
                        "content": {"application/json": {"schema": _ref("ChatCompletionRequest")}},
                    },
                    "responses": {
                        "200": {
                            "description": "The answer (stream: true: server-sent events).",
                            "content": {
                                "application/json": {"schema": _ref("ChatCompletion")},
                                "text/event-stream": {"schema": STRING},
                            },
                        },
                        "202": _json(_ref("Job"), "Deferred (Prefer: respond-async): a job."),
                        **_errors(400, 401, 403, 404, 409, 413, 422, 429, 502, 503, 504),
                    },
                }
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
                                    "data": {"type": "array", "items": _ref("Model")},
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
                        "200": _json(_ref("Model"), "One model this key may use."),
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
                        "200": _json(_ref("Generation"), "The stored record of one request."),
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
                        "200": _json(_ref("Job"), "The job's state, and its answer once done."),
                        **_errors(401, 404, 503),
                    },
                },
                "delete": {
                    "operationId": "jobCancel",
                    "responses": {
                        "200": _json(_ref("Job"), "Cancelled."),
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
                "Job": JOB,
                "Model": MODEL,
                "Generation": GENERATION,
                "ErrorEnvelope": ERROR_ENVELOPE,
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
